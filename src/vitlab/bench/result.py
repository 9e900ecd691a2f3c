"""What one benchmark run reports: :class:`BenchResult`, its ``--json`` form and its text summary."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

from .stats import faults_differ

__all__ = ["BenchResult"]


@dataclass
class BenchResult:
    """One benchmark run; ``to_dict`` is the ``--json`` output."""

    model: str
    mode: str
    batch_size: int
    img_size: int
    dtype: str
    device: str
    threads: int
    compile: str | None
    ref_compile: str | None
    """The reference's ``torch.compile`` mode: ``compile`` unless ``ref_eager``."""
    params: int
    gflops_per_image: float
    """Forward GFLOPs of one image (x3 for a training step)."""
    images_per_sec: float
    step_ms: float
    gflops_per_sec: float
    peak_gflops_per_sec: float | None
    fraction_of_peak: float | None
    ref: str | None = None
    ref_images_per_sec: float | None = None
    ref_gflops_per_sec: float | None = None
    ratio: float | None = None
    """``images_per_sec / ref_images_per_sec`` (> 1: we are faster)."""
    optimizer: str | None = None
    """Training step only: ours is what ``vitlab train`` builds, the reference's plain ``torch.optim.AdamW``."""
    ref_optimizer: str | None = None
    pair_ratios: tuple[float, float, float] | None = None
    """(min, median, max) over steps of ref time / our time of each interleaved pair: the spread
    shows how far the load of a shared machine moved the ratio."""
    pair_ratio_interval: tuple[float, float] | None = None
    """95% bootstrap interval of the per-pair median (:func:`median_interval`): a target inside
    it is not shown either way by this run; more ``steps`` narrow it. It treats the steps as
    independent, so it cannot see what stays fixed for a whole run (which process got which
    memory, a neighbour's load): repeat runs too."""
    compile_seconds: float | None = None
    ref_compile_seconds: float | None = None
    steps: int = 0
    warmup: int = 0
    step_times_ms: list[float] = field(default_factory=list)
    ref_step_times_ms: list[float] = field(default_factory=list)
    inference_path: str | None = None
    """Eager inference only: what vitlab's forward ran, e.g. ``oneDNN fused linears, 2 chunks of <= 16``
    (the fused oneDNN linears and ``VisionTransformer.inference_chunk_size``) or ``aten``; see
    :mod:`vitlab.bench.paths`."""
    training_path: str | None = None
    """Eager training only: what vitlab's blocks ran, ``fused blocks, C kernels`` (one autograd node
    per block with vitlab's native C kernels), ``fused blocks, ATen kernels`` (no C compiler,
    ``VITLAB_NATIVE=0`` or a tanh GELU) or ``autograd``; see :mod:`vitlab.bench.paths`."""
    isolate: bool = False
    """Each model ran in a worker process of its own (see :func:`benchmark`)."""
    faults_per_step: float | None = None
    """Minor page faults per timed step of vitlab's model (pages the kernel had to map in); None
    where the platform cannot count them."""
    ref_faults_per_step: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """A few human-readable lines."""
        ref_opt = f"; {self.ref}: {self.ref_optimizer}" if self.ref else ""
        what = "inference" if self.mode == "infer" else f"training step (fwd+bwd+{self.optimizer}{ref_opt})"
        comp = f", torch.compile({self.compile})" if self.compile else ", eager"
        frac = f"  ({100 * self.fraction_of_peak:.0f}% of peak)" if self.fraction_of_peak is not None else ""
        lines = [
            f"{self.model} {what}: batch {self.batch_size}, {self.img_size} px, {self.dtype}, {self.device}, "
            f"{self.threads} threads{comp}",
            f"  vitlab: {self.images_per_sec:8.2f} img/s  {self.step_ms:9.1f} ms/step  "
            f"{self.gflops_per_sec:7.1f} GFLOP/s{frac}",
        ]
        if (path := self.inference_path or self.training_path) is not None:
            lines.append(f"          ({path})")
        if self.ref is not None and self.ref_images_per_sec is not None and self.ref_gflops_per_sec is not None:
            lines += self._reference_lines()
        if self.faults_per_step is not None:
            lines += self._fault_lines()
        if self.peak_gflops_per_sec is not None:
            lines.append(f"  matmul peak: {self.peak_gflops_per_sec:.1f} GFLOP/s ({self.dtype}, measured in this run)")
        if self.compile_seconds is not None:
            ref_c = f", {self.ref} {self.ref_compile_seconds:.1f} s" if self.ref_compile_seconds is not None else ""
            lines.append(f"  compile time: vitlab {self.compile_seconds:.1f} s{ref_c}")
        return "\n".join(lines)

    def _reference_lines(self) -> list[str]:
        """The reference's rate, the ratio and the per-pair ratios."""
        assert self.ref_images_per_sec is not None and self.ref_gflops_per_sec is not None
        frac = (
            f"  ({100 * self.ref_gflops_per_sec / self.peak_gflops_per_sec:.0f}% of peak)"
            if self.peak_gflops_per_sec
            else ""
        )
        ref_ms = statistics.median(self.ref_step_times_ms)
        ref_label = self.ref if self.ref_compile == self.compile else f"{self.ref} ({self.ref_compile or 'eager'})"
        lines = [
            f"  {ref_label:>6}: {self.ref_images_per_sec:8.2f} img/s  {ref_ms:9.1f} ms/step  "
            f"{self.ref_gflops_per_sec:7.1f} GFLOP/s{frac}",
            f"  ratio vitlab / {self.ref}: {self.ratio:.3f}x (medians of {self.steps} interleaved steps)",
        ]
        if self.pair_ratios is not None:
            lo, mid, hi = self.pair_ratios
            ci = ""
            if self.pair_ratio_interval is not None:
                ci = f" (95% interval {self.pair_ratio_interval[0]:.3f}x - {self.pair_ratio_interval[1]:.3f}x)"
            lines.append(f"  per-pair ratios: median {mid:.3f}x{ci}, range {lo:.3f}x - {hi:.3f}x")
        return lines

    def _fault_lines(self) -> list[str]:
        """Page faults per step of each side, and a warning where one process made them depend on each other."""
        assert self.faults_per_step is not None
        ref_f = f", {self.ref} {self.ref_faults_per_step:,.0f}" if self.ref_faults_per_step is not None else ""
        where = "each model in its own process" if self.isolate else "one process"
        lines = [f"  page faults per step: vitlab {self.faults_per_step:,.0f}{ref_f} ({where})"]
        if (
            not self.isolate
            and self.ref_faults_per_step is not None
            and faults_differ(self.faults_per_step, self.ref_faults_per_step)
        ):
            lines.append(
                "  (in one process the models share the C heap, so these depend on each other; "
                "--isolate separates them)"
            )
        return lines

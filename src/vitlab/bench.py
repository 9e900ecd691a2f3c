"""Throughput of a ViT against the machine's matmul peak and against timm / Hugging Face.

Why measure this way: on a shared machine absolute timings drift by 2x from
minute to minute, so a lone number means little. :func:`benchmark` therefore
times our model and the reference **interleaved in the same process** (one step
of each, alternating which goes first) and reports medians and their ratio,
and expresses achieved GFLOP/s as a fraction of a dense matmul timed in the same
run (:func:`matmul_peak`).

FLOPs are counted analytically (:func:`vitlab.models.count_macs`, matmuls only,
2 FLOPs per multiply-accumulate); a training step counts 3x the forward
(forward, and the two matmuls per layer of the backward), the usual convention.

    from vitlab.bench import benchmark
    r = benchmark("vit_s16", batch_size=32, vs="timm")
    print(r.images_per_sec, r.ratio)
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .errors import ConfigError, VitlabError
from .models import Block, VisionTransformer, ViTConfig, count_macs, create_model, fused_block, onednn

__all__ = [
    "BenchResult",
    "benchmark",
    "build_reference",
    "matmul_peak",
    "median_interval",
    "model_overrides",
    "plain_adamw",
    "vitlab_optimizer",
]

MODES = ("infer", "train")
REFERENCES = ("timm", "hf", "vitlab")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class MissingReferenceError(VitlabError, ImportError):
    """``--vs timm`` / ``--vs hf`` without the package installed."""


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
    (see :mod:`vitlab.models.onednn` and ``VisionTransformer.inference_chunk_size``) or ``aten``."""
    training_path: str | None = None
    """Eager training only: what vitlab's blocks ran, ``fused blocks, C kernels`` (one autograd node
    per block with the kernels of :mod:`vitlab.models.native`), ``fused blocks, ATen kernels`` (no C
    compiler, ``VITLAB_NATIVE=0`` or a tanh GELU) or ``autograd`` (see :mod:`vitlab.models.fused_block`)."""
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
        lines = [
            f"{self.model} {what}: batch {self.batch_size}, {self.img_size} px, {self.dtype}, {self.device}, {self.threads} threads{comp}",
            f"  vitlab: {self.images_per_sec:8.2f} img/s  {self.step_ms:9.1f} ms/step  {self.gflops_per_sec:7.1f} GFLOP/s"
            + (f"  ({100 * self.fraction_of_peak:.0f}% of peak)" if self.fraction_of_peak is not None else ""),
        ]
        if (path := self.inference_path or self.training_path) is not None:
            lines.append(f"          ({path})")
        if self.ref is not None and self.ref_images_per_sec is not None and self.ref_gflops_per_sec is not None:
            frac = (
                f"  ({100 * self.ref_gflops_per_sec / self.peak_gflops_per_sec:.0f}% of peak)"
                if self.peak_gflops_per_sec
                else ""
            )
            ref_ms = statistics.median(self.ref_step_times_ms)
            ref_label = self.ref if self.ref_compile == self.compile else f"{self.ref} ({self.ref_compile or 'eager'})"
            lines.append(
                f"  {ref_label:>6}: {self.ref_images_per_sec:8.2f} img/s  {ref_ms:9.1f} ms/step  {self.ref_gflops_per_sec:7.1f} GFLOP/s{frac}"
            )
            lines.append(f"  ratio vitlab / {self.ref}: {self.ratio:.3f}x (medians of {self.steps} interleaved steps)")
            if self.pair_ratios is not None:
                lo, mid, hi = self.pair_ratios
                ci = ""
                if self.pair_ratio_interval is not None:
                    ci = f" (95% interval {self.pair_ratio_interval[0]:.3f}x - {self.pair_ratio_interval[1]:.3f}x)"
                lines.append(f"  per-pair ratios: median {mid:.3f}x{ci}, range {lo:.3f}x - {hi:.3f}x")
        if self.faults_per_step is not None:
            ref_f = f", {self.ref} {self.ref_faults_per_step:,.0f}" if self.ref_faults_per_step is not None else ""
            where = "each model in its own process" if self.isolate else "one process"
            lines.append(f"  page faults per step: vitlab {self.faults_per_step:,.0f}{ref_f} ({where})")
            if (
                not self.isolate
                and self.ref_faults_per_step is not None
                and _faults_differ(self.faults_per_step, self.ref_faults_per_step)
            ):
                lines.append(
                    "  (in one process the models share the C heap, so these depend on each other; --isolate separates them)"
                )
        if self.peak_gflops_per_sec is not None:
            lines.append(f"  matmul peak: {self.peak_gflops_per_sec:.1f} GFLOP/s ({self.dtype}, measured in this run)")
        if self.compile_seconds is not None:
            ref_c = f", {self.ref} {self.ref_compile_seconds:.1f} s" if self.ref_compile_seconds is not None else ""
            lines.append(f"  compile time: vitlab {self.compile_seconds:.1f} s{ref_c}")
        return "\n".join(lines)


def median_interval(
    values: list[float], *, level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of ``values`` (deterministic for a ``seed``).

    Why: on a shared machine a few steps can move the median ratio by 10%; the interval says
    whether a run separates a result from a target (e.g. 1.3x) or needs more steps."""
    if not values:
        raise ValueError("median_interval needs at least one value")
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1.0 - level) / 2
    return meds[round(tail * (resamples - 1))], meds[round((1.0 - tail) * (resamples - 1))]


def _faults_differ(a: float, b: float) -> bool:
    """Page-fault counts far enough apart to move a timing (~1 us each on a CPU)."""
    return abs(a - b) > max(10_000, 0.5 * max(a, b))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(
    *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, n: int = 2048, repeats: int = 5
) -> float:
    """The machine's dense-matmul throughput in GFLOP/s: the best of ``repeats``
    timed ``n x n @ n x n`` products (a peak is a maximum, and the best run is
    the one the other tenants of a shared machine disturbed least).

    On a CPU with oneDNN, in float32, the product is timed with both libraries the models
    use, MKL's sgemm (``a @ b``) and oneDNN's GEMM on a pre-packed weight (the kernel of
    vitlab's inference path, :mod:`vitlab.models.onednn`), and the faster one is the peak:
    oneDNN's ran ~15% faster here, and a fraction of MKL's peak would pass 100%.

    :func:`benchmark` samples it once per timed round and 5 times at the end and
    keeps the best, so a load spike at the end cannot shrink it below what the
    machine delivered while the models ran."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    products: list[Callable[[], object]] = [lambda: a @ b]
    if device.type == "cpu" and dtype == torch.float32 and onednn.available():
        packed = onednn.pack(b)
        products.append(lambda: onednn.packed_product(a, packed))
    best = float("inf")
    with torch.inference_mode():
        for product in products:
            product()  # warm the kernels and the allocator
            _sync(device)
            for _ in range(repeats):
                t0 = time.perf_counter()
                product()
                _sync(device)
                best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def model_overrides(
    *,
    img_size: int | None = None,
    patch_size: int | None = None,
    dim: int | None = None,
    depth: int | None = None,
    heads: int | None = None,
    mlp_ratio: float | None = None,
    base_dim: int | None = None,
) -> dict[str, Any]:
    """The architecture flags of ``vitlab train`` / ``vitlab bench`` as ``create_model`` overrides."""
    ov: dict[str, Any] = {}
    for key, val in (
        ("img_size", img_size),
        ("patch_size", patch_size),
        ("embed_dim", dim),
        ("depth", depth),
        ("num_heads", heads),
    ):
        if val is not None:
            ov[key] = val
    if mlp_ratio is not None:
        if mlp_ratio <= 0:
            raise ConfigError(f"mlp_ratio: must be positive, got {mlp_ratio}")
        width = dim or base_dim
        if width is None:
            raise ConfigError("mlp_ratio: the model width is unknown; pass dim as well")
        ov["mlp_dim"] = round(width * mlp_ratio)
    return ov


def build_reference(kind: str, cfg: ViTConfig) -> nn.Module:
    """The timm or Hugging Face model with the same architecture as ``cfg``, or (``vitlab``)
    a second copy of ours: an A/A control whose ratio should be 1, so its spread is the noise
    floor of the measurement on this machine.

    Only plain ViTs (class token or GAP, learned 1-D posemb, linear head) have
    a timm / HF equivalent; anything else raises ``ConfigError``.
    """
    if kind == "vitlab":
        return VisionTransformer(cfg)
    if cfg.posemb != "learn" or cfg.head != "linear" or cfg.dynamic_img_pad:
        raise ConfigError(f"--vs {kind}: only plain ViTs (learned posemb, linear head) have a {kind} equivalent")
    if kind == "timm":
        try:
            from timm.models.vision_transformer import VisionTransformer as TimmViT
        except ImportError as e:
            raise MissingReferenceError("--vs timm needs timm: pip install timm") from e
        act = nn.GELU if cfg.act == "gelu" else (lambda: nn.GELU(approximate="tanh"))
        return TimmViT(
            img_size=cfg.img_size,
            patch_size=cfg.patch_size,
            in_chans=cfg.in_chans,
            num_classes=cfg.num_classes,
            global_pool="token" if cfg.pool == "cls" else "avg",
            embed_dim=cfg.embed_dim,
            depth=cfg.depth,
            num_heads=cfg.num_heads,
            mlp_ratio=cfg.mlp_dim / cfg.embed_dim,
            qkv_bias=cfg.qkv_bias,
            class_token=cfg.class_token,
            fc_norm=cfg.fc_norm if cfg.pool == "gap" else False,
            act_layer=act,
        )
    if kind == "hf":
        if cfg.pool != "cls" or cfg.img_size[0] != cfg.img_size[1]:
            raise ConfigError("--vs hf: Hugging Face's ViT has class-token pooling and square images only")
        try:
            from transformers import ViTConfig as HFConfig
            from transformers import ViTForImageClassification
        except ImportError as e:
            raise MissingReferenceError("--vs hf needs transformers: pip install transformers") from e
        hf_cfg = HFConfig(
            hidden_size=cfg.embed_dim,
            num_hidden_layers=cfg.depth,
            num_attention_heads=cfg.num_heads,
            intermediate_size=cfg.mlp_dim,
            hidden_act="gelu" if cfg.act == "gelu" else "gelu_pytorch_tanh",
            layer_norm_eps=cfg.norm_eps,
            image_size=cfg.img_size[0],
            patch_size=cfg.patch_size,
            num_channels=cfg.in_chans,
            num_labels=max(cfg.num_classes, 1),
            qkv_bias=cfg.qkv_bias,
        )
        hf_cfg._attn_implementation = "sdpa"
        hf = ViTForImageClassification(hf_cfg)
        return _LogitsOnly(hf)
    raise ConfigError(f"--vs: {kind!r} is not one of {', '.join(REFERENCES)}")


class _LogitsOnly(nn.Module):
    """Hugging Face models return an output object; the bench wants a tensor."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(pixel_values=x).logits


def vitlab_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """What ``vitlab train`` builds (the ``small-data`` recipe's AdamW: parameter groups, fused kernel)."""
    from .train.optim import build_optimizer
    from .train.recipes import get_recipe

    return build_optimizer(model, get_recipe("small-data"), 1e-3)


def plain_adamw(model: nn.Module) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` with PyTorch's defaults, as a timm / HF user writes it."""
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)


def _is_plain(model: nn.Module) -> bool:
    """A plain ViT: patch-conv stem and standard blocks (not the hybrid's ResNet stem or axial blocks)."""
    from .models import Block, PatchEmbed

    return (
        type(model) is VisionTransformer
        and type(model.patch_embed) is PatchEmbed
        and all(type(b) is Block for b in model.blocks)  # type: ignore[union-attr]
    )


def _describe(opt: torch.optim.Optimizer) -> str:
    d = opt.defaults
    impl = "fused" if d.get("fused") else "foreach" if d.get("foreach") else "default"
    return f"{type(opt).__name__}({impl})"


def _make_step(
    model: nn.Module,
    mode: str,
    x: torch.Tensor,
    y: torch.Tensor,
    autocast: contextlib.AbstractContextManager[Any] | None,
    opt: torch.optim.Optimizer | None = None,
) -> Callable[[], None]:
    """One inference forward, or one full training step (forward, backward, ``opt``)."""
    amp: Callable[[], contextlib.AbstractContextManager[Any]] = (
        (lambda: autocast) if autocast is not None else contextlib.nullcontext
    )  # type: ignore[assignment,return-value]
    if mode == "infer":
        model.eval()

        def infer() -> None:
            with torch.inference_mode(), amp():
                model(x)

        return infer
    if opt is None:
        raise ValueError("a training step needs an optimizer")
    model.train()

    def train() -> None:
        with amp():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return train


def _inference_path(model: nn.Module, x: torch.Tensor) -> str:
    """Which of vitlab's CPU inference paths an eval-mode forward of ``x`` takes."""
    with torch.inference_mode():
        fused = any(isinstance(b, Block) for b in model.modules()) and onednn.applies(model.eval(), x)
        size = model.inference_chunk_size(x) if isinstance(model, VisionTransformer) else x.shape[0]
    parts = ["oneDNN fused linears" if fused else "aten"]
    if size < x.shape[0]:
        parts.append(f"{-(-x.shape[0] // size)} chunks of <= {size}")
    return ", ".join(parts)


def _training_path(model: nn.Module) -> str:
    """Which of vitlab's CPU training paths a training forward of ``model`` takes (fp32, eager)."""
    blocks = [b for b in model.modules() if isinstance(b, Block)]
    with torch.enable_grad():
        fused = bool(blocks) and all(
            fused_block.applies(b, torch.empty(1, 1, b.norm1.normalized_shape[0])) for b in blocks
        )
    if not fused:
        return "autograd"
    return "fused blocks, " + ("C kernels" if all(fused_block.uses_c_kernels(b) for b in blocks) else "ATen kernels")


def _autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any] | None:
    """Mixed precision as a user would run it: fp32 weights, matmuls in ``dtype``."""
    if dtype == torch.float32:
        return None
    if dtype == torch.float16 and device.type == "cpu":
        raise ConfigError("dtype: float16 autocast is for CUDA; use bfloat16 on CPU")
    return torch.autocast(device_type=device.type, dtype=dtype)


def _freezing(on: bool) -> contextlib.AbstractContextManager[Any]:
    """Inductor's ``freezing`` for inference: weights become constants, so on CPU linear layers
    get pre-packed MKL/oneDNN weights with bias and GELU fused into the GEMM."""
    if not on:
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config

    return inductor_config.patch(freezing=True)


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[int]:
    prev = torch.get_num_threads()
    if n is not None:
        if n <= 0:
            raise ConfigError(f"threads: must be positive, got {n}")
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(prev)


@dataclass(frozen=True)
class _Side:
    """One side of a comparison, everything needed to build and time it (picklable: an
    ``isolate`` run sends it to a worker process)."""

    key: str  # "ours" or "ref"
    model: str
    overrides: dict[str, Any]
    mode: str
    batch_size: int
    num_classes: int
    dtype: str
    device: str
    vs: str | None
    compile: str | None
    threads: int | None
    seed: int


@dataclass
class _Built:
    step: Callable[[], None]
    params: int
    gflops_per_image: float
    """Forward GFLOPs per image the model executes (2 x multiply-accumulates)."""
    config: ViTConfig
    compile_seconds: float | None
    optimizer: str | None
    inference_path: str | None
    training_path: str | None


def _build(side: _Side, *, progress: bool = False) -> _Built:
    """The model of ``side``, its inputs and its step (compiled and run once if asked)."""
    dev = torch.device(side.device)
    tdtype = DTYPES[side.dtype]
    with torch.device("meta"):  # the architecture only: no weights, no init
        probe = create_model(side.model, num_classes=side.num_classes, **side.overrides)
    cfg: ViTConfig = probe.config  # type: ignore[assignment]
    if side.vs in ("timm", "hf") and not _is_plain(probe):
        raise ConfigError(
            f"--vs {side.vs}: {cfg.name} is not a plain ViT (hybrid stem or axial blocks); only plain ViTs have a {side.vs} equivalent here"
        )
    torch.manual_seed(side.seed)
    model = (
        create_model(side.model, num_classes=side.num_classes, **side.overrides)
        if side.key == "ours"
        else build_reference(side.vs or "vitlab", cfg)
    ).to(dev)
    g = torch.Generator().manual_seed(side.seed + 1)  # the same images on both sides, in any process
    x = torch.randn(side.batch_size, cfg.in_chans, *cfg.img_size, generator=g).to(dev)
    y = torch.randint(0, max(side.num_classes, 1), (side.batch_size,), generator=g).to(dev)
    amp = _autocast(dev, tdtype)
    # an A/A run (--vs vitlab) trains both copies alike; timm and HF get AdamW as their users write it
    make_opt = vitlab_optimizer if side.key == "ours" or side.vs == "vitlab" else plain_adamw
    opt = make_opt(model) if side.mode == "train" else None
    target = torch.compile(model, mode=side.compile) if side.compile else model
    step = _make_step(target, side.mode, x, y, amp, opt)  # type: ignore[arg-type]
    compile_s = None
    if side.compile:  # the first call compiles; time it on its own
        if progress:
            who = "vitlab" if side.key == "ours" else side.vs
            print(
                f"compiling {who} ({side.mode}) with torch.compile(mode={side.compile!r}) ...",
                file=sys.stderr,
                flush=True,
            )
        t0 = time.perf_counter()
        with _freezing(side.mode == "infer"):
            step()
        _sync(dev)
        compile_s = time.perf_counter() - t0
    # what each model runs: ours count a hybrid's ResNet stem, and less for a class-token-only last block
    macs = model.macs(executed=True) if isinstance(model, VisionTransformer) else count_macs(cfg)
    return _Built(
        step=step,
        params=sum(p.numel() for p in model.parameters()),
        gflops_per_image=2 * macs / 1e9,
        config=cfg,
        compile_seconds=compile_s,
        optimizer=_describe(opt) if opt is not None else None,
        inference_path=_inference_path(model, x)
        if side.key == "ours" and side.mode == "infer" and not side.compile and amp is None
        else None,
        training_path=_training_path(model)
        if side.key == "ours" and side.mode == "train" and not side.compile and amp is None and dev.type == "cpu"
        else None,
    )


def _minor_faults() -> int | None:
    """Minor page faults of this process so far (None where ``resource`` is missing, e.g. Windows)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _timed(step: Callable[[], None], dev: torch.device) -> tuple[float, int | None]:
    _sync(dev)
    f0 = _minor_faults()
    t0 = time.perf_counter()
    step()
    _sync(dev)
    dt = time.perf_counter() - t0
    f1 = _minor_faults()
    return dt, None if f0 is None or f1 is None else f1 - f0


class _Local:
    """A side built and timed in this process."""

    def __init__(self, side: _Side, progress: bool) -> None:
        self.built = _build(side, progress=progress)
        self._dev = torch.device(side.device)

    def step(self) -> tuple[float, int | None]:
        return _timed(self.built.step, self._dev)

    def close(self) -> None:
        pass


def _serve(conn: Any, side: _Side) -> None:
    """Worker process of an ``isolate`` run: build ``side``, then time one step per request."""
    try:
        with _threads(side.threads):
            built = _build(side)
            info = dataclasses.replace(built, step=None)  # type: ignore[arg-type]
            conn.send(("ready", info))
            dev = torch.device(side.device)
            while conn.recv() == "step":
                conn.send(_timed(built.step, dev))
    except Exception as e:  # report it to the parent, which raises it there
        conn.send(("error", e))
    finally:
        conn.close()


class _Remote:
    """A side built and timed in a worker process of its own (``isolate``): its own heap, so
    the other model's allocations cannot change its page faults."""

    def __init__(self, side: _Side) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # no fork of a process that has OpenMP threads running
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, side), daemon=True)
        self._proc.start()
        child.close()
        kind, payload = self._conn.recv()
        if kind == "error":
            self.close()
            raise payload
        self.built: _Built = payload

    def step(self) -> tuple[float, int | None]:
        self._conn.send("step")
        reply = self._conn.recv()
        if isinstance(reply, tuple) and reply and reply[0] == "error":
            raise reply[1]
        return reply

    def close(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send("stop")
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()


def benchmark(
    model: str = "vit_s16",
    *,
    mode: str = "infer",
    batch_size: int = 32,
    num_classes: int = 1000,
    dtype: str = "float32",
    device: str = "cpu",
    vs: str | None = None,
    steps: int = 10,
    warmup: int = 2,
    compile: str | None = None,
    ref_eager: bool = False,
    threads: int | None = None,
    measure_peak: bool = True,
    peak_size: int = 2048,
    progress: bool = False,
    seed: int = 0,
    isolate: bool = False,
    **overrides: Any,
) -> BenchResult:
    """Time ``steps`` inference forwards or training steps of ``model`` (a registered
    name) and, with ``vs="timm"`` or ``"hf"``, of the equivalent reference model,
    interleaved. ``overrides`` are :class:`ViTConfig` fields (``img_size``,
    ``patch_size``, ``embed_dim``, ``depth``, ``num_heads``, ``mlp_dim`` ...).

    ``compile`` (a ``torch.compile`` mode) compiles both models, so the ratio
    stays like-for-like; the first call's time is reported as compile time.
    Inference compiles with inductor's ``freezing`` (weights as constants).
    ``ref_eager`` compiles ours only: the ratio is then that of ``vitlab train --compile``
    against the reference as its users run it by default.

    ``isolate`` builds and runs each model in a worker process of its own, still one step of
    each in turn. Why: in one process the two models share the C heap, and which one freed
    memory last decides how many pages the other must fault in again (on the CIFAR training
    step a reference model paid ~130k faults per step beside vitlab against ~60-100k alone;
    ``faults_per_step`` reports them). Isolated, each runs as it would in its user's program.
    """
    if mode not in MODES:
        raise ConfigError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    if vs is not None and vs not in REFERENCES:
        raise ConfigError(f"vs: {vs!r} is not one of {', '.join(REFERENCES)}")
    if compile is not None and compile not in COMPILE_MODES:
        raise ConfigError(f"compile: {compile!r} is not one of {', '.join(COMPILE_MODES)}")
    if ref_eager and not (compile and vs):
        raise ConfigError("ref_eager (--ref-eager) needs compile and a reference (--compile --vs ...)")
    if batch_size <= 0 or steps <= 0 or warmup < 0:
        raise ConfigError(f"batch_size and steps must be positive and warmup >= 0, got {batch_size}, {steps}, {warmup}")
    if threads is not None and threads <= 0:
        raise ConfigError(f"threads: must be positive, got {threads}")
    if isolate and vs is None:
        raise ConfigError("isolate (--isolate) needs a reference to compare with (--vs ...)")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ConfigError(f"device: {device!r} is not a torch device") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: CUDA was requested but torch sees no GPU")
    tdtype = DTYPES[dtype]

    def side(key: str) -> _Side:
        comp = compile if key == "ours" or not ref_eager else None
        return _Side(
            key, model, dict(overrides), mode, batch_size, num_classes, dtype, str(dev), vs, comp, threads, seed
        )

    keys = ["ours"] + (["ref"] if vs else [])
    runners: dict[str, _Local | _Remote] = {}
    with _threads(threads) as n_threads:
        try:
            for key in keys:
                runners[key] = _Remote(side(key)) if isolate else _Local(side(key), progress)

            from tqdm.auto import tqdm

            times: dict[str, list[float]] = {k: [] for k in keys}
            faults: dict[str, list[int | None]] = {k: [] for k in keys}
            peaks: list[float] = []
            name = runners["ours"].built.config.name
            for i in tqdm(range(warmup + steps), desc=f"bench {name} {mode}", disable=not progress, leave=False):
                for key in keys if i % 2 == 0 else keys[::-1]:
                    dt, nf = runners[key].step()
                    if i >= warmup:
                        times[key].append(dt)
                        faults[key].append(nf)
                if measure_peak and i >= warmup:  # sample the peak under the same load as the steps
                    peaks.append(matmul_peak(device=dev, dtype=tdtype, n=peak_size, repeats=1))
            peak = max([*peaks, matmul_peak(device=dev, dtype=tdtype, n=peak_size)]) if measure_peak else None
        finally:
            for r in runners.values():
                r.close()

    ours = runners["ours"].built
    per_step = 3 if mode == "train" else 1

    def rate(ts: list[float], gflops_img: float) -> tuple[float, float]:
        med = statistics.median(ts)
        return batch_size / med, gflops_img * batch_size * per_step / med

    def mean_faults(fs: list[int | None]) -> float | None:
        return None if any(f is None for f in fs) else sum(fs) / len(fs)  # type: ignore[misc]

    ips, gfs = rate(times["ours"], ours.gflops_per_image)
    res = BenchResult(
        model=ours.config.name,
        mode=mode,
        batch_size=batch_size,
        img_size=ours.config.img_size[0],
        dtype=dtype,
        device=str(dev),
        threads=n_threads,
        compile=compile,
        ref_compile=None if ref_eager else compile,
        params=ours.params,
        gflops_per_image=ours.gflops_per_image,
        images_per_sec=ips,
        step_ms=1e3 * statistics.median(times["ours"]),
        gflops_per_sec=gfs,
        peak_gflops_per_sec=peak,
        fraction_of_peak=gfs / peak if peak else None,
        compile_seconds=ours.compile_seconds,
        optimizer=ours.optimizer,
        steps=steps,
        warmup=warmup,
        inference_path=ours.inference_path,
        training_path=ours.training_path,
        step_times_ms=[1e3 * t for t in times["ours"]],
        isolate=isolate,
        faults_per_step=mean_faults(faults["ours"]),
    )
    if vs is not None:
        ref = runners["ref"].built
        r_ips, r_gfs = rate(times["ref"], ref.gflops_per_image)
        res.ref = vs
        res.ref_images_per_sec = r_ips
        res.ref_gflops_per_sec = r_gfs
        res.ratio = ips / r_ips
        res.ref_compile_seconds = ref.compile_seconds
        res.ref_optimizer = ref.optimizer
        res.ref_step_times_ms = [1e3 * t for t in times["ref"]]
        res.ref_faults_per_step = mean_faults(faults["ref"])
        pairs = sorted(r / o for o, r in zip(times["ours"], times["ref"]))
        res.pair_ratios = (pairs[0], statistics.median(pairs), pairs[-1])
        res.pair_ratio_interval = median_interval(pairs)
    return res

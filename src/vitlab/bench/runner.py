""":func:`benchmark`: our model and the reference, built as :class:`Side` s and timed one step of
each in turn, summed up as a :class:`BenchResult`."""

from __future__ import annotations

import statistics
from typing import Any

from ..devices import autocast, resolve_device
from ..errors import ConfigError
from ..models import ViTConfig
from .references import REFERENCES
from .result import BenchResult
from .sides import COMPILE_MODES, DTYPES, MODES, Side
from .stats import matmul_peak, median_interval
from .workers import InProcess, WorkerProcess, num_threads

__all__ = ["benchmark"]


def benchmark(
    model: str | ViTConfig = "vit_s16",
    *,
    mode: str = "infer",
    batch_size: int = 32,
    num_classes: int | None = None,
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
    name, or a :class:`ViTConfig`: a trained model's architecture, built with random weights)
    with ``num_classes`` classes (None: the model's) and, with ``vs="timm"`` or ``"hf"``,
    of the equivalent reference model, interleaved. ``overrides`` are :class:`ViTConfig` fields (``img_size``,
    ``patch_size``, ``embed_dim``, ``depth``, ``num_heads``, ``mlp_dim`` ...).
    ``device`` is a torch device name or ``auto`` (:func:`vitlab.devices.resolve_device`).

    ``compile`` (a ``torch.compile`` mode) compiles both models, so the ratio
    stays like-for-like; the first call's time is reported as compile time.
    Inference compiles with inductor's ``freezing`` (weights as constants).
    ``ref_eager`` compiles ours only: the ratio is then that of ``vitlab train --compile``
    against the reference as its users run it by default.

    ``isolate`` builds and runs each model in a worker process of its own, still one step of
    each in turn. Why: in one process the two models share the C heap, and which one freed
    memory last decides how many pages the other must fault in again, so one model's page
    faults depend on the other (``faults_per_step`` reports them). Isolated, each runs as it
    would in its user's program.
    """
    _check(mode, dtype, vs, compile, ref_eager, batch_size, steps, warmup, threads, isolate)
    dev = resolve_device(device)
    tdtype = DTYPES[dtype]
    autocast(dev, tdtype)  # float16 on a CPU raises ConfigError before anything is built

    def side(key: str) -> Side:
        comp = compile if key == "ours" or not ref_eager else None
        return Side(
            key=key,
            model=model,
            overrides=dict(overrides),
            mode=mode,
            batch_size=batch_size,
            num_classes=num_classes,
            dtype=dtype,
            device=str(dev),
            vs=vs,
            compile=comp,
            threads=threads,
            seed=seed,
        )

    keys = ["ours"] + (["ref"] if vs else [])
    runners: dict[str, InProcess | WorkerProcess] = {}
    with num_threads(threads) as n_threads:
        try:
            for key in keys:
                runners[key] = WorkerProcess(side(key)) if isolate else InProcess(side(key), progress)

            from .._progress import ProgressLog

            times: dict[str, list[float]] = {k: [] for k in keys}
            faults: dict[str, list[int | None]] = {k: [] for k in keys}
            peaks: list[float] = []
            name = runners["ours"].built.config.name
            total = warmup + steps
            log = ProgressLog(total=total, desc=f"bench {name} {mode}", enabled=progress, leave=False, every=0)
            for i in log.wrap(range(total)):
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


def _check(
    mode: str,
    dtype: str,
    vs: str | None,
    compile: str | None,
    ref_eager: bool,
    batch_size: int,
    steps: int,
    warmup: int,
    threads: int | None,
    isolate: bool,
) -> None:
    """The options of :func:`benchmark` that can be checked before anything is built (ConfigError)."""
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

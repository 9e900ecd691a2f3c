"""The numbers a comparison rests on: the machine's matmul peak, the interval of a median ratio,
and whether two page-fault counts differ enough to matter."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import torch

from .paths import onednn_product

__all__ = ["faults_differ", "matmul_peak", "median_interval", "sync"]


def median_interval(
    values: list[float], *, level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of ``values`` (deterministic for a ``seed``).

    Why: on a shared machine a few steps can move the median ratio a long way; the interval says
    whether a run separates a result from a target (e.g. 1.3x) or needs more steps."""
    if not values:
        raise ValueError("median_interval needs at least one value")
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1.0 - level) / 2
    return meds[round(tail * (resamples - 1))], meds[round((1.0 - tail) * (resamples - 1))]


def faults_differ(a: float, b: float) -> bool:
    """Page-fault counts far enough apart to move a timing (each fault costs the CPU on the order
    of a microsecond)."""
    return abs(a - b) > max(10_000, 0.5 * max(a, b))


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so a wall-clock interval covers it."""
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
    vitlab's inference path), and the faster one is the peak: otherwise vitlab's fraction
    of the peak could pass 100%.

    :func:`benchmark` samples it once per timed round and ``repeats`` times at the end and
    keeps the best, so a load spike at the end cannot shrink it below what the
    machine delivered while the models ran."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    products: list[Callable[[], object]] = [lambda: a @ b]
    if (packed := onednn_product(a, b)) is not None:
        products.append(packed)
    best = float("inf")
    with torch.inference_mode():
        for product in products:
            product()  # warm the kernels and the allocator
            sync(device)
            for _ in range(repeats):
                t0 = time.perf_counter()
                product()
                sync(device)
                best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9

"""Throughput of a ViT against the machine's matmul peak and against timm / Hugging Face.

Why measure this way: on a shared machine absolute timings drift from minute to minute, so a
lone number means little. :func:`benchmark` therefore times our model and the reference
**interleaved** (one step of each, alternating which goes first; in one process, or each in a
worker process of its own) and reports medians and their ratio, and expresses achieved GFLOP/s
as a fraction of a dense matmul timed in the same run (:func:`matmul_peak`).

FLOPs are counted analytically (:func:`vitlab.models.count_macs`, matmuls only,
2 FLOPs per multiply-accumulate); a training step counts 3x the forward
(forward, and the two matmuls per layer of the backward), the usual convention.

    from vitlab.bench import benchmark
    r = benchmark("vit_s16", batch_size=32, vs="timm")
    print(r.images_per_sec, r.ratio)

Anything else a benchmark times (a decoder, an exported model, one kernel) goes through :func:`time_calls`: the
same interleaving for plain callables.

The modules: :mod:`.runner` (:func:`benchmark`), :mod:`.calls` (:func:`time_calls`), :mod:`.sides` (what one
side builds and times), :mod:`.workers` (timing a side here or in a worker process), :mod:`.references` (timm / HF
models and the optimizers), :mod:`.stats` (peak, bootstrap interval), :mod:`.result` (:class:`BenchResult`) and
:mod:`.paths` (which of vitlab's fast paths ran).
"""

from __future__ import annotations

from .calls import CallTimes, time_calls
from .references import (
    REFERENCES,
    MissingReferenceError,
    build_reference,
    model_overrides,
    plain_adamw,
    vitlab_optimizer,
)
from .result import BenchResult
from .runner import benchmark
from .sides import COMPILE_MODES, DTYPES, MODES, Built, Side, build_side
from .stats import matmul_peak, median_interval
from .workers import InProcess, WorkerProcess

__all__ = [
    "COMPILE_MODES",
    "DTYPES",
    "MODES",
    "REFERENCES",
    "BenchResult",
    "Built",
    "CallTimes",
    "InProcess",
    "MissingReferenceError",
    "Side",
    "WorkerProcess",
    "benchmark",
    "build_reference",
    "build_side",
    "matmul_peak",
    "median_interval",
    "model_overrides",
    "plain_adamw",
    "time_calls",
    "vitlab_optimizer",
]

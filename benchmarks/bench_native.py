"""The fused C kernels of the CPU training step against ATen's, each in a process of its own.

    python benchmarks/bench_native.py                        # 4 pairs of processes, 30 steps each
    python benchmarks/bench_native.py --drop-path 0.1        # with stochastic depth (the small-data recipe)
    python benchmarks/bench_native.py --pairs 2 --steps 10   # quicker

The small CIFAR configuration of the performance issue (32 px, patch 4, width 192, depth 9, 3
heads, MLP 384, batch 128, AdamW). Each pair starts two of `vitlab bench`'s worker processes, one
with the kernels and one with ``VITLAB_NATIVE=0``, and alternates their training steps, so both
see the same moments of a shared machine; a new pair of processes per row, because which memory a
process gets changes its page faults (docs/performance.md). Prints per pair
the median step of each side, the ratio of the medians and the median of the per-step ratios
(ATen / C: above 1 means the kernels are faster), and the page faults per step.
"""

from __future__ import annotations

import argparse
import os
import statistics

from _common import CIFAR_TRAIN_STEP, native

from vitlab.bench import Side, WorkerProcess


def side(drop_path: float) -> Side:
    """The training target's run of ``bench_targets.py`` (the CIFAR training step), with stochastic depth
    ``drop_path``."""
    run = dict(CIFAR_TRAIN_STEP)
    fixed = {k: run.pop(k) for k in ("model", "mode", "batch_size", "num_classes")}
    return Side(key="ours", overrides={**run, "drop_path_rate": drop_path}, threads=2, **fixed)


def start(drop_path: float, *, kernels: bool) -> WorkerProcess:
    """A worker process; the environment it starts with decides whether it uses the C kernels."""
    before = os.environ.get("VITLAB_NATIVE")
    os.environ["VITLAB_NATIVE"] = "1" if kernels else "0"
    try:
        return WorkerProcess(side(drop_path))
    finally:
        if before is None:
            del os.environ["VITLAB_NATIVE"]
        else:
            os.environ["VITLAB_NATIVE"] = before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=4, help="pairs of worker processes (default 4)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per process (default 30)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--drop-path", type=float, default=0.0)
    args = ap.parse_args()
    if not native.available():
        raise SystemExit("the C kernels are not available here (no C compiler, or VITLAB_NATIVE=0): nothing to compare")
    print(f"# load average at start: {os.getloadavg()}", flush=True)
    for p in range(args.pairs):
        runners = {"C": start(args.drop_path, kernels=True), "ATen": start(args.drop_path, kernels=False)}
        times: dict[str, list[float]] = {k: [] for k in runners}
        faults: dict[str, list[int]] = {k: [] for k in runners}
        try:
            for i in range(args.warmup + args.steps):
                order = ("C", "ATen") if i % 2 == 0 else ("ATen", "C")
                for k in order:
                    dt, f = runners[k].step()
                    if i >= args.warmup:
                        times[k].append(dt)
                        faults[k].append(f or 0)
        finally:
            for r in runners.values():
                r.close()
        c, a = statistics.median(times["C"]), statistics.median(times["ATen"])
        per_pair = statistics.median(y / x for x, y in zip(times["C"], times["ATen"]))
        print(
            f"pair {p}: C {1e3 * c:.0f} ms, ATen {1e3 * a:.0f} ms, ratio of medians {a / c:.3f}x, "
            f"per-pair median {per_pair:.3f}x, "
            f"faults/step {statistics.mean(faults['C']):,.0f} / {statistics.mean(faults['ATen']):,.0f}",
            flush=True,
        )
    print(f"# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

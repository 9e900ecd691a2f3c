"""The performance targets of docs/performance.md, each timed against timm, interleaved step by step.

    python benchmarks/bench_targets.py                 # all three, eager
    python benchmarks/bench_targets.py --only train --isolate   # each model in its own worker process
    python benchmarks/bench_targets.py --compile       # torch.compile both sides
    python benchmarks/bench_targets.py --only train --compile --ref-eager   # compiled vitlab vs eager timm
    python benchmarks/bench_targets.py --only train --steps 20
    python benchmarks/bench_targets.py --only train --isolate --steps 30 --runs 5   # five runs, then a verdict

Prints one JSON line per run (the `vitlab bench --json` fields) and a summary. With --runs N each
target is run N times and a last table gives every run's ratio and per-pair median next to the
target: a run's bootstrap interval covers step-to-step noise only, and on a shared VM the runs
themselves differ (docs/performance.md), so a target counts as met when every run clears it.
Takes a few minutes on the 2-core CPU; check `uptime` first, the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from _common import CIFAR_TRAIN_STEP

from vitlab.bench import benchmark

RUNS = {
    "s16": dict(model="vit_s16", mode="infer", batch_size=32),
    "b16": dict(model="vit_b16", mode="infer", batch_size=16),
    # The small CIFAR configuration of the training issue: 32 px, patch 4, width 192, depth 9, 3 heads, MLP ratio 2.
    "train": dict(CIFAR_TRAIN_STEP),
}

TARGETS = {"s16": 1.15, "b16": 1.15, "train": 1.3}
"""Ratio to timm each run must reach (the performance issue); ViT-B/16 also >= 85% of the matmul peak."""
PEAK_TARGET = {"b16": 0.85}


def verdict(key: str, runs: list[dict]) -> str:
    """One line per target over repeated runs: each run's ratio of medians and per-pair median."""
    ratios = [r["ratio"] for r in runs]
    pairs = [r["pair_ratios"][1] for r in runs if r.get("pair_ratios")]
    line = (
        f"{key}: target {TARGETS[key]:.2f}x | ratio per run "
        + " ".join(f"{x:.3f}" for x in ratios)
        + f" (median {statistics.median(ratios):.3f}) | per-pair median per run "
        + " ".join(f"{x:.3f}" for x in pairs)
    )
    met = all(x >= TARGETS[key] for x in ratios + pairs)
    if key in PEAK_TARGET:
        fracs = [r["fraction_of_peak"] for r in runs if r.get("fraction_of_peak") is not None]
        line += " | of peak " + " ".join(f"{x:.0%}" for x in fracs)
        met = met and bool(fracs) and all(x >= PEAK_TARGET[key] for x in fracs)
    return line + (" | met in every run" if met else " | NOT met in every run")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=list(RUNS), action="append")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", nargs="?", const="default", default=None)
    ap.add_argument("--ref-eager", action="store_true", help="with --compile: leave the reference eager")
    ap.add_argument("--vs", default="timm")
    ap.add_argument(
        "--isolate", action="store_true", help="each model in a worker process of its own (vitlab bench --isolate)"
    )
    ap.add_argument("--runs", type=int, default=1, help="repeat each target this many times, then print a verdict")
    args = ap.parse_args()
    print(f"# load average at start: {os.getloadavg()}")
    done: dict[str, list[dict]] = {}
    for key in args.only or list(RUNS):
        for _ in range(args.runs):
            kw = dict(RUNS[key])
            r = benchmark(
                kw.pop("model"),
                vs=args.vs,
                steps=args.steps,
                warmup=args.warmup,
                compile=args.compile,
                ref_eager=args.ref_eager,
                isolate=args.isolate,
                progress=True,
                **kw,
            )
            row = {k: v for k, v in r.to_dict().items() if "times" not in k}
            done.setdefault(key, []).append(row)
            print(json.dumps(row))
            print(r.summary(), flush=True)
            print(f"# load average: {os.getloadavg()}", flush=True)
    if args.runs > 1 and args.vs == "timm" and args.compile is None:  # the targets are for the eager default path
        print(f"# over {args.runs} runs of {args.steps} steps{' (isolated)' if args.isolate else ''}:")
        for key, runs in done.items():
            print(verdict(key, runs))
    print(f"# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

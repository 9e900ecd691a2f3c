"""The performance targets of docs/performance.md, each timed against timm, interleaved step by step.

    python benchmarks/bench_targets.py                 # all three, eager
    python benchmarks/bench_targets.py --only train --isolate   # each model in its own worker process
    python benchmarks/bench_targets.py --compile       # torch.compile both sides
    python benchmarks/bench_targets.py --only train --compile --ref-eager   # compiled vitlab vs eager timm
    python benchmarks/bench_targets.py --only train --steps 20

Prints one JSON line per run (the `vitlab bench --json` fields) and a summary.
Takes a few minutes on the 2-core CPU; check `uptime` first, the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os

from vitlab.bench import benchmark

RUNS = {
    "s16": dict(model="vit_s16", mode="infer", batch_size=32),
    "b16": dict(model="vit_b16", mode="infer", batch_size=16),
    # The small CIFAR configuration of the training issue: 32 px, patch 4, width 192, depth 9, 3 heads, MLP ratio 2.
    "train": dict(
        model="vit_ti16",
        mode="train",
        batch_size=128,
        num_classes=10,
        img_size=32,
        patch_size=4,
        embed_dim=192,
        depth=9,
        num_heads=3,
        mlp_dim=384,
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=list(RUNS), action="append")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", nargs="?", const="default", default=None)
    ap.add_argument("--ref-eager", action="store_true", help="with --compile: leave the reference eager")
    ap.add_argument("--vs", default="timm")
    ap.add_argument("--isolate", action="store_true", help="each model in a worker process of its own (vitlab bench --isolate)")
    args = ap.parse_args()
    print(f"# load average at start: {os.getloadavg()}")
    for key in args.only or list(RUNS):
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
        print(json.dumps({k: v for k, v in r.to_dict().items() if "times" not in k}))
        print(r.summary(), flush=True)
    print(f"# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

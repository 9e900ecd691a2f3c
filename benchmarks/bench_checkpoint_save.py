"""How long an epoch's end takes to save the run's state, for models from the auto recipe's tiny one to ViT-B/16:
``last.pt`` written by the run's own writer (``torch.save`` into a temporary file, fsync, rename over ``last.pt``,
fsync of the folder), holding the weights and AdamW's two moments of each (12 bytes a parameter), beside what the
time budget's first plan counts for it (``vitlab.train.sizing.pace.save_seconds``) until the run has timed its own
epoch ends. Run it alone on the machine; it writes under ``--work`` (default: a temporary folder, removed).

    python benchmarks/bench_checkpoint_save.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from _common import atomic_torch_save, save_seconds, work_folder

from vitlab.bench import time_calls

MODELS = {"tiny (auto)": 556_298, "base (auto)": 2_712_778, "vit_s16": 22_050_664, "vit_b16": 86_567_656}
"""Parameters of each model (``vitlab.create_model(name).num_params()``; the auto recipe's at 64 px, patch 8)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="timed saves of each model (default 5; the median is shown)")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="which models")
    ap.add_argument("--work", type=Path, default=None, help="where last.pt is written (default: a temporary folder)")
    args = ap.parse_args()
    with work_folder(args.work) as work:
        states = {n: {k: torch.randn(MODELS[n]) for k in ("weights", "exp_avg", "exp_avg_sq")} for n in args.models}
        calls = {name: (lambda s=state: atomic_torch_save(s, work / "last.pt")) for name, state in states.items()}
        times = time_calls(calls, rounds=args.rounds, warmup=1)
    print("| model | parameters | last.pt | saving (median) | MB/s | the first plan counts |")
    print("|---|---|---|---|---|---|")
    for name, t in times.items():
        n = MODELS[name]
        mb = 12 * n / 1e6
        print(
            f"| {name} | {n:,} | {mb:,.0f} MB | {t.median:.3f} s | {mb / t.median:,.0f} | "
            f"{save_seconds(params=n, trainable=n):.3f} s |"
        )
    print(f"\n# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

"""Parameter-efficient fine-tuning on the CPU (issue 60): (a) one training step's time and memory for each method, and
(b) what each method reaches in the same wall time on a transfer task.

(a) ``step``: ViT-Ti/16, S/16 and B/16 at 224 px, batch 32, random images: one step (forward, backward, the AdamW
vitlab builds, over the parameters that train) for full fine-tuning, LoRA (r = 4 and 8), SSF, bias-only and head-only.
Times by :func:`vitlab.bench.time_calls` (every method once a round, the order alternating); memory per method alone
first: the peak resident memory its steps add (``VmHWM`` after resetting it, less the RSS before, as
``memory_calibration.py`` measures a run) and the bytes of its gradients and optimizer state. Prints a markdown table.

    python benchmarks/bench_peft.py step                                   # all three models (B/16: minutes a round)
    python benchmarks/bench_peft.py step --models vit_ti16 --rounds 3 --threads 4
    python benchmarks/bench_peft.py step --models vit_ti16 --side 64 --batch 128 \
        --arch patch_size=8,embed_dim=128,depth=4,num_heads=2,mlp_dim=512   # the auto recipe's smallest model

(b) ``transfer``: ``vitlab finetune --init RUN --data DIR --time-budget T --tune X`` for each method and seed, each a
process of its own, one after another; the table of the evaluation top-1 each run reports (summary.json).

    python benchmarks/bench_peft.py transfer --init runs/cifar10 --data clothing --budget 2m --seeds 0,1

(c) ``splits``: the folders of docs/transfer.md's method table, links to CIFAR-10's files: ``source`` (the six animal
classes, all 30,000 training images; 200 test images a class to watch), ``c100``, ``c1000``, ``c3000`` (the four
vehicle classes, the first N/4 training images of each; 500 test images a class to evaluate on).

    python benchmarks/bench_peft.py splits --cifar ../shared/data/cifar10 --out runs/peft_data
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

import vitlab
from vitlab.adapters import apply_tuning, trainable_counts
from vitlab.bench import time_calls, vitlab_optimizer

METHODS = {"full": ("full", 0), "lora4": ("lora", 4), "lora8": ("lora", 8), "ssf": ("ssf", 0), "bias": ("bias", 0),
           "head": ("head", 0)}  # fmt: skip
"""Row name -> (``--tune`` method, LoRA rank)."""
NUM_CLASSES = 10


def tuned_model(name: str, method: str, rank: int, *, side: int, arch: dict[str, int] | None = None) -> nn.Module:
    """``name`` at ``side`` px (randomly initialised, 10 classes, vitlab's speed paths; ``arch``: ``create_model``
    overrides) set to train by ``method``."""
    torch.manual_seed(0)
    model = vitlab.create_model(name, num_classes=NUM_CLASSES, img_size=side, **(arch or {}))
    if method == "head":
        model.requires_grad_(False)
        model.head.requires_grad_(True)
    elif method != "full":
        apply_tuning(model, method, rank=max(rank, 1))
    return model.train()


class Step:
    """One training step of a model on a fixed batch: forward, cross-entropy, backward, AdamW over what trains."""

    def __init__(self, model: nn.Module, *, batch: int, side: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.model, self.opt = model, vitlab_optimizer(model)
        self.x = torch.randn(batch, 3, side, side, generator=g)
        self.y = torch.randint(0, NUM_CLASSES, (batch,), generator=g)

    def __call__(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(self.model(self.x), self.y).backward()
        self.opt.step()

    def state_bytes(self) -> int:
        """Bytes of the gradients and the optimizer state (after a step)."""
        grads = sum(p.grad.numel() * p.grad.element_size() for p in self.model.parameters() if p.grad is not None)
        opt = sum(
            t.numel() * t.element_size() for s in self.opt.state.values() for t in s.values() if torch.is_tensor(t)
        )
        return grads + opt


def _status(key: str) -> int:
    """A ``/proc/self/status`` value in bytes (0 where there is none)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def step_memory(
    name: str, method: str, rank: int, *, batch: int, side: int, arch: dict[str, int]
) -> tuple[int | None, int]:
    """``(peak bytes two steps add over the RSS before them, or None where VmHWM cannot be reset; gradient and
    optimizer-state bytes)`` of one method, alone in the process."""
    step = Step(tuned_model(name, method, rank, side=side, arch=arch), batch=batch, side=side)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: what follows is the steps' own peak
        rss = _status("VmRSS")
    except OSError:
        rss = None
    step()
    step()
    peak = _status("VmHWM") - rss if rss else None
    return peak, step.state_bytes()


def step_rows(
    name: str, *, batch: int, side: int, rounds: int, warmup: int, arch: dict[str, int]
) -> list[dict[str, Any]]:
    rows = []
    for row, (method, rank) in METHODS.items():
        peak, state = step_memory(name, method, rank, batch=batch, side=side, arch=arch)
        trained, total = trainable_counts(tuned_model(name, method, rank, side=side, arch=arch))
        rows.append({"method": row, "peak": peak, "state": state, "trained": trained, "total": total})
    steps = {
        r: Step(tuned_model(name, m, k, side=side, arch=arch), batch=batch, side=side) for r, (m, k) in METHODS.items()
    }
    times = time_calls(steps, rounds=rounds, warmup=warmup)
    for r in rows:
        r["ms"] = 1000 * times[r["method"]].median
    return rows


def run_step(a: argparse.Namespace) -> None:
    if a.threads:
        torch.set_num_threads(a.threads)
    mib = 1 << 20
    print(f"CPU, {torch.get_num_threads()} threads, {a.side} px, batch {a.batch}, median of {a.rounds} rounds\n")
    print("| model | method | trains | ms per step | vs full | peak added (MiB) | grads + optimizer state (MiB) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    arch = {k: int(v) for k, v in (item.split("=", 1) for item in a.arch.split(",") if item)}
    for name in a.models.split(","):
        rows = step_rows(name, batch=a.batch, side=a.side, rounds=a.rounds, warmup=a.warmup, arch=arch)
        full = next(r["ms"] for r in rows if r["method"] == "full")
        for r in rows:
            peak = f"{r['peak'] / mib:,.0f}" if r["peak"] is not None else "n/a"
            share = f"{r['trained']:,} ({100 * r['trained'] / r['total']:.2f}%)"
            print(f"| {name} | {r['method']} | {share} | {r['ms']:,.0f} | {r['ms'] / full:.2f} | {peak} | "
                  f"{r['state'] / mib:,.1f} |", flush=True)  # fmt: skip
    print(f"\n# load average at end: {os.getloadavg()[0]:.2f}")


def run_transfer(a: argparse.Namespace) -> None:
    """Each method and seed fine-tuned for the same ``--budget``; the top-1 each run reports."""
    out = Path(a.out or tempfile.mkdtemp(prefix="bench_peft_"))
    methods = a.methods.split(",")
    seeds = [int(s) for s in a.seeds.split(",")]
    top1: dict[str, list[float]] = {m: [] for m in methods}
    for seed in seeds:
        for m in methods:
            method, rank = METHODS[m]
            tune = ["--lora", str(rank)] if method == "lora" else ["--tune", method]
            run = out / f"{m}-seed{seed}"
            cmd = [sys.executable, "-m", "vitlab", "finetune", "--init", a.init, "--data", a.data, "--time-budget",
                   a.budget, "--seed", str(seed), *tune, "--out", str(run), "--overwrite", "--no-progress",
                   *a.extra]  # fmt: skip
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
            summary = json.loads((run / "summary.json").read_text())
            top1[m].append(100 * summary["top1"])
    print(f"\n| method | {' | '.join(f'seed {s}' for s in seeds)} | mean |\n|---|{'---:|' * (len(seeds) + 1)}")
    for m in methods:
        print(f"| {m} | {' | '.join(f'{t:.2f}' for t in top1[m])} | {statistics.mean(top1[m]):.2f} |")
    print(f"\n# load average at end: {os.getloadavg()[0]:.2f}")


ANIMALS = ("bird", "cat", "deer", "dog", "frog", "horse")
VEHICLES = ("airplane", "automobile", "ship", "truck")


def run_splits(a: argparse.Namespace) -> None:
    """(c): the source and target folders, each file a link to CIFAR-10's (a new folder: nothing is overwritten)."""
    cifar, out = Path(a.cifar).resolve(), Path(a.out)
    out.mkdir(parents=True, exist_ok=False)

    def link(dst: Path, files: list[Path]) -> None:
        dst.mkdir(parents=True)
        for f in files:
            os.symlink(f, dst / f.name)

    def files(split: str, c: str) -> list[Path]:
        return sorted((cifar / split / c).glob("*.jpg"))

    for c in ANIMALS:
        link(out / "source/train" / c, files("train", c))
        link(out / "source/val" / c, files("test", c)[:200])
    for n in (100, 1000, 3000):
        for c in VEHICLES:
            link(out / f"c{n}/train" / c, files("train", c)[: n // 4])
            link(out / f"c{n}/val" / c, files("test", c)[:500])
    print(f"{out}: source/, c100/, c1000/, c3000/")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("step", help="(a) one training step's time and memory per method")
    s.add_argument("--models", default="vit_ti16,vit_s16,vit_b16")
    s.add_argument("--side", type=int, default=224)
    s.add_argument("--batch", type=int, default=32)
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument("--warmup", type=int, default=2)
    s.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    s.add_argument("--arch", default="", help="create_model overrides, e.g. patch_size=8,embed_dim=128 (integers)")
    t = sub.add_parser("transfer", help="(b) each method's top-1 at equal wall time")
    t.add_argument("--init", required=True, help="the pre-trained model (run or model folder, public name)")
    t.add_argument("--data", required=True)
    t.add_argument("--budget", default="2m", help="--time-budget of each run")
    t.add_argument("--methods", default=",".join(METHODS))
    t.add_argument("--seeds", default="0,1")
    t.add_argument("--out", default=None, help="where the runs go (default: a temporary folder)")
    t.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more finetune flags, last")
    c = sub.add_parser("splits", help="(c) the CIFAR-10 folders of docs/transfer.md's method table")
    c.add_argument("--cifar", required=True, help="CIFAR-10 as an image folder (train/, test/)")
    c.add_argument("--out", required=True, help="a new folder")
    a = p.parse_args()
    {"step": run_step, "transfer": run_transfer, "splits": run_splits}[a.what](a)


if __name__ == "__main__":
    main()

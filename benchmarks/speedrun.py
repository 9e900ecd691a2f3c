"""Time to accuracy: train CIFAR-10 (or any ImageFolder) from scratch for a fixed wall budget with ``vitlab train
--time-budget`` and report the test top-1 it reached (the rules and the records: docs/speedrun.md). Three tracks:

- ``vit``: the pure ViT, patch embedding as in Eq. 1 (4x4 patches of the 32 px images, no convolutional stem);
- ``hybrid``: the paper's hybrid input (Sec. 3.1), the R+Ti/16 ResNet stem with 1x1 patches;
- ``cct``: CCT's convolutional tokenizer (Hassani et al. 2021), a registered ``vit_cct*`` model with its own shape.

Each runs the track's recipe (``docs/cifar10.md``: width 128, depth 6, 4 heads, MLP ratio 2, GAP, sine-cosine
position embeddings for the first two; the ``vit_cct*`` name's own shape for ``cct``; AdamW 2e-3, warmup + cosine
planned for the budget, crop + flip, label smoothing 0.1) plus, by default, the flags of the track's current record
(:data:`RECORDS`), so that ``python benchmarks/speedrun.py --track T --minutes 20 --data DIR`` re-runs the record;
``--from recipe`` starts from the bare recipe instead. Levers are ``vitlab train`` flags added last (``--token-drop``,
``--token-drop-until``, ``--res-schedule``, ``--ema``, and any other through ``--train-args``), overriding the
record's and the recipe's, so that a run with a lever and one without differ in nothing else; a ``--model`` in
``--train-args`` replaces the track's model and shape (the name's own shape holds unless ``--train-args`` sets
one). The last stdout line is one JSON object: ``track, minutes, top1, top5, steps, images_per_sec, wall_s,
device, minutes_to, levers, record, command``; ``minutes_to``: training minutes to 60%, 70% and 80% test top-1
(``command``: the exact ``vitlab train`` command line). ``--baseline timm`` runs a plain timm script of the same
model and recipe for the same budget instead (``speedrun_timm.py``).

    python benchmarks/speedrun.py --track vit --minutes 20 --data ../shared/data/cifar10      # the vit record
    python benchmarks/speedrun.py --track hybrid --minutes 20 --data ../shared/data/cifar10 --train-args "--tta flip"
    python benchmarks/speedrun.py --track vit --minutes 5 --data ../shared/data/cifar10 --from recipe --token-drop 0.5
    python benchmarks/speedrun.py --track vit --minutes 20 --data ../shared/data/cifar10 --baseline timm
    python benchmarks/speedrun.py --track vit --minutes 20 --data ../shared/data/cifar10 --device cuda  # bf16, compile
    python benchmarks/speedrun.py --smoke --track cct      # tiny generated data, a few seconds: the CI check
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ARCH = {
    "vit": ["--patch-size", "4"],
    "hybrid": ["--model", "vit_r_ti16", "--patch-size", "1"],
    "cct": ["--model", "vit_cct7_3x2"],
}
"""Each track's model. ``cct``: CCT-7/3x2 (two 3x3 convolutions with 2x2 max-pools: an 8 x 8 grid of tokens at 32 px,
as many as the vit track's 4x4 patches), in its own shape: width 256, 7 blocks, 4 heads, sequence pooling."""
INPUTS = {"vit": [], "hybrid": ["--norm-stats", "inception"], "cct": []}
"""The hybrid keeps 0.5 / 0.5 input normalisation: its stem standardises its weights and normalises groups of
channels, and the data's statistics did not help it (docs/speedrun.md); the others take the data's."""
SHAPE = [*("--dim", "128", "--depth", "6", "--heads", "4", "--mlp-ratio", "2", "--pool", "gap", "--posemb", "sincos2d")]
"""The recipe's model shape (docs/cifar10.md), for the tracks whose model has no shape of its own."""
OWN_SHAPE = {"cct"}
"""Tracks whose registered model keeps its own shape."""
RECIPE = [
    *("--recipe", "small-data", "--batch-size", "128", "--lr", "2e-3", "--weight-decay", "0.05"),
    *("--warmup-epochs", "0.3", "--clip-grad", "1", "--crop-scale", "0.6,1", "--hflip", "0.5"),
    *("--label-smoothing", "0.1", "--mixup", "0", "--cutmix", "0", "--randaugment", "none"),
    *("--random-erasing", "0", "--drop-path", "0"),
]
"""The 20-minute recipe of docs/cifar10.md, without the model and the budget."""
SMOKE = [*("--dim", "16", "--depth", "1", "--heads", "2", "--mlp-ratio", "2", "--batch-size", "8", "--lr", "1e-3")]
"""Replaces the model size and batch for ``--smoke``: a few seconds on tiny generated data."""


@dataclass(frozen=True)
class Record:
    """A track's current record at 20 minutes on 2 CPU cores (docs/speedrun.md, "Records"): the ``vitlab train``
    flags it adds over the track's recipe, the test top-1 of its runs (%, one per seed) and where they were run."""

    flags: tuple[str, ...]
    runs: tuple[float, ...] = ()
    commit: str = ""
    note: str = ""

    @property
    def top1(self) -> float | None:
        """The mean of the runs (None: no record yet)."""
        return round(sum(self.runs) / len(self.runs), 2) if self.runs else None


RECORDS = {
    "vit": Record(
        flags=("--token-drop", "0.5", "--res-schedule", "24:0.5,32:1.0"),
        runs=(71.48, 71.48),
        commit="8466026, d38f433",
        note="token dropping (PatchDropout) and progressive resolution",
    ),
    "hybrid": Record(
        flags=("--token-drop", "0.5"), runs=(74.49, 74.69), commit="2299fef to beff335", note="token dropping"
    ),
    "cct": Record(flags=(), note="no record yet: the track's starting recipe, not run at a budget"),
}
"""One entry per track: the current record's exact flags (what ``--from record``, the default, adds)."""
GPU_NOTE = (
    "speedrun: the GPU track (--device {device}) has not been verified on hardware: no GPU run has been made, so "
    "its recipe (bf16 autocast, --compile, the CPU record's flags) is untested there and its result is no record"
)


def tiny_data(root: Path, *, per_class: int = 12, size: int = 8) -> Path:
    """A generated ImageFolder (class = the dominant colour channel) with ``train/`` and ``test/``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("test", 4)):
        for c in range(3):
            d = root / split / f"class{c}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                arr = rng.integers(0, 80, (size, size, 3)).astype(np.uint8)
                arr[..., c] += 150
                Image.fromarray(arr).save(d / f"{i:02d}.png")
    return root


def named_model(train_args: str | None) -> bool:
    """Whether ``--train-args`` chooses the model (``--model``): it then replaces the track's model and shape."""
    return any(a == "--model" or a.startswith("--model=") for a in shlex.split(train_args or ""))


def train_command(args: argparse.Namespace, data: str, out: str) -> list[str]:
    """The ``vitlab train`` argument list (after ``vitlab``) of this run: the track's model, inputs and shape, the
    recipe (the smoke check's size), the budget and run flags, the record's flags (unless ``--from recipe``), then
    the levers, ``--train-args`` last."""
    own = named_model(args.train_args)
    cmd = ["train", "--data", data, "--out", out, *([] if own else ARCH[args.track]), *INPUTS[args.track]]
    cmd += [] if own or args.track in OWN_SHAPE else SHAPE
    cmd += RECIPE
    if args.smoke:
        cmd += SMOKE
    cmd += ["--time-budget", f"{args.minutes * 60:g}s", "--seed", str(args.seed), "--no-progress"]
    if args.device != "cpu":
        cmd += ["--device", args.device, "--precision", "bf16"]
    if args.compile:
        cmd += ["--compile"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if getattr(args, "start", "record") == "record":
        cmd += list(RECORDS[args.track].flags)
    for flag, value in levers(args).items():
        cmd += shlex.split(value) if flag == "train_args" else [flag, str(value)]
    return cmd


def levers(args: argparse.Namespace) -> dict[str, object]:
    """The levers given on this command line, as ``vitlab train`` flags (``train_args``: the flags given to
    ``--train-args``, appended last); the record's own flags are not among them."""
    given = {
        "--token-drop": args.token_drop,
        "--token-drop-until": args.token_drop_until,
        "--res-schedule": args.res_schedule,
        "--ema": args.ema,
    }
    given["train_args"] = args.train_args or None
    return {k: v for k, v in given.items() if v is not None}


def minutes_to(rows: list[dict], targets: tuple[float, ...] = (0.6, 0.7, 0.8)) -> dict[str, float | None]:
    """Time to target: for each top-1 ``target``, the training wall minutes at the end of the first epoch whose
    test evaluation reached it (``None``: never), from the run's ``metrics.jsonl`` rows. An upper bound: the
    schedule was planned for the whole budget, and the test set is only evaluated once an epoch."""
    out: dict[str, float | None] = {}
    for t in targets:
        hit = [r["wall_s"] for r in rows if r.get("top1") is not None and r["top1"] >= t]
        out[f"{t * 100:g}"] = round(min(hit) / 60, 2) if hit else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--track", choices=list(ARCH), required=True)
    p.add_argument(
        "--from",
        dest="start",
        choices=["record", "recipe"],
        default="record",
        help="start from the track's current record (its flags, docs/speedrun.md) or from the bare recipe",
    )
    p.add_argument("--minutes", type=float, default=None, help="wall budget (default 20; 0.1 with --smoke)")
    p.add_argument("--data", default=None, help="ImageFolder with train/ and test/ (e.g. ../shared/data/cifar10)")
    p.add_argument("--device", default="cpu", help="cpu, cuda ... (not cpu: bf16 autocast)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="torch.compile the model")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="run folder (default: a temporary one, removed)")
    p.add_argument("--token-drop", type=float, default=None, help="lever: vitlab train --token-drop")
    p.add_argument("--token-drop-until", type=float, default=None, help="lever: vitlab train --token-drop-until")
    p.add_argument("--res-schedule", default=None, help="lever: vitlab train --res-schedule (e.g. 24:0.5,32:1.0)")
    p.add_argument("--ema", type=float, default=None, help="lever: vitlab train --ema")
    p.add_argument(
        "--train-args",
        default=None,
        help="further vitlab train flags, appended last so that they override the recipe's "
        "(e.g. '--pool cls', '--dim 192 --depth 3 --heads 6', '--batch-size 256 --accum-steps 2')",
    )
    p.add_argument(
        "--baseline",
        choices=["timm"],
        default=None,
        help="instead of vitlab: a plain timm script of the same size and recipe (vit track; speedrun_timm.py)",
    )
    p.add_argument("--smoke", action="store_true", help="tiny generated data and model: checks the pipeline only")
    args = p.parse_args(argv)
    if args.minutes is None:
        args.minutes = 0.1 if args.smoke else 20.0
    if args.compile is None:
        args.compile = not args.smoke  # as docs/cifar10.md (1.17x faster steps on the CPU)
    if not args.smoke and not args.data:
        p.error("--data DIR is required (or --smoke)")
    if args.baseline and (args.track != "vit" or levers(args) or args.device != "cpu"):
        p.error("--baseline timm is the vit track on the CPU, without levers")
    if args.device != "cpu":
        print(GPU_NOTE.format(device=args.device), flush=True)
    with tempfile.TemporaryDirectory(prefix="speedrun-") as tmp:
        data = str(tiny_data(Path(tmp) / "data")) if args.smoke else args.data
        out = args.out or str(Path(tmp) / "run")
        if args.baseline:
            from speedrun_timm import run

            shown = "python benchmarks/speedrun.py " + shlex.join(argv if argv is not None else sys.argv[1:])
            print(shown, flush=True)
            s = run(data, minutes=args.minutes, seed=args.seed, threads=args.threads, smoke=args.smoke)
            rows, wall = s["rows"], s["wall_s"]
        else:
            cmd = train_command(args, data, out)
            shown = "vitlab " + shlex.join(cmd)
            print(shown, flush=True)
            t0 = time.perf_counter()
            rc = subprocess.call([sys.executable, "-m", "vitlab", *cmd], env={**os.environ, "PYTHONUNBUFFERED": "1"})
            wall = time.perf_counter() - t0
            if rc != 0:
                print(f"speedrun: vitlab train exited with {rc}", file=sys.stderr)
                return rc
            s = json.loads((Path(out) / "summary.json").read_text())
            rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    row = {
        "track": args.track,
        "minutes": args.minutes,
        "top1": s["top1"],
        "top5": s["top5"],
        "best_top1": s["best_top1"],
        "steps": s["steps"],
        "epochs": s["epochs"],
        "images_per_sec": round(s["images_per_sec"], 1),
        "wall_s": round(wall, 1),
        "device": args.device,
        "seed": args.seed,
        "smoke": args.smoke,
        "minutes_to": minutes_to(rows),
        "epoch_top1": [r.get("top1") for r in rows],
        "levers": levers(args),
        "record": None if args.baseline or args.start != "record" else list(RECORDS[args.track].flags),
        "hardware_verified": args.device == "cpu",
        "baseline": args.baseline,
        "command": shown,
    }
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())

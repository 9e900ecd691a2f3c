"""Time to accuracy: train CIFAR-10 (or any ImageFolder) from scratch for a fixed wall budget with ``vitlab train
--time-budget`` and report the test top-1 it reached (the rules and the records: docs/speedrun.md). Two tracks:

- ``vit``: the pure ViT, patch embedding as in Eq. 1 (4x4 patches of the 32 px images, no convolutional stem);
- ``hybrid``: a convolutional stem before the Transformer (Sec. 3.1): the R+Ti/16 ResNet stem with 1x1 patches.

Each runs the track's recipe (``docs/cifar10.md``: width 128, depth 6, 4 heads, MLP ratio 2, GAP, sine-cosine
position embeddings, AdamW 2e-3, warmup + cosine planned for the budget, crop + flip, label smoothing 0.1) plus, by
default, the flags of the track's current record (``speedrun_records.RECORDS``), so that ``python
benchmarks/speedrun.py --track T --minutes 20 --data DIR`` re-runs the record; ``--from recipe`` starts from the bare
recipe instead. Levers are added after the record's flags: ``--levers a,b`` names those of issue 38
(``speedrun_levers.LEVERS``: cct, seq-pool, muon, whiten, tta-flip, tta-flip-last, ema, mpp), then the flags
``--token-drop``, ``--token-drop-until``, ``--res-schedule``, and any other ``vitlab train`` flag through
``--train-args``, last, so that a run with a lever and one without differ in nothing else; a ``--model`` in
``--train-args`` replaces the track's model and shape (the name's own shape holds unless ``--train-args`` sets one).
The last stdout line is one JSON object: ``track, minutes, top1, top5, steps, images_per_sec, wall_s, device,
minutes_to, levers, named_levers, record, command, reproduce``; ``minutes_to``: training minutes to 60%, 70% and
80% test top-1 (``command``: the exact ``vitlab train`` command line; ``reproduce``: this run's speedrun command with
every choice spelled out). ``--baseline timm`` runs a plain timm script of the same model and recipe for the same
budget instead (``speedrun_timm.py``); ``--records`` prints docs/speedrun.md's records and levers tables.

    python benchmarks/speedrun.py --track vit --minutes 20 --data ../shared/data/cifar10      # the vit record
    python benchmarks/speedrun.py --track hybrid --minutes 20 --data ../shared/data/cifar10 --levers cct,whiten
    python benchmarks/speedrun.py --track vit --minutes 5 --data ../shared/data/cifar10 --from recipe --token-drop 0.5
    python benchmarks/speedrun.py --track vit --minutes 20 --data ../shared/data/cifar10 --baseline timm
    python benchmarks/speedrun.py --track vit --minutes 20 --data ../shared/data/cifar10 --device cuda  # bf16, compile
    python benchmarks/speedrun.py --smoke --track vit      # tiny generated data, a few seconds: the CI check
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
from pathlib import Path

from speedrun_levers import lever_flags, levers_markdown
from speedrun_records import TRACKS, current, records_markdown

ARCH = {"vit": ["--patch-size", "4"], "hybrid": ["--model", "vit_r_ti16", "--patch-size", "1"]}
"""Each track's model (the ``cct`` lever replaces the hybrid's)."""
INPUTS = {"vit": [], "hybrid": ["--norm-stats", "inception"]}
"""The hybrid keeps 0.5 / 0.5 input normalisation: its stem standardises its weights and normalises groups of
channels, and the data's statistics did not help it (docs/speedrun.md); the pure ViT takes the data's."""
SHAPE = [*("--dim", "128", "--depth", "6", "--heads", "4", "--mlp-ratio", "2", "--pool", "gap", "--posemb", "sincos2d")]
"""The recipe's model shape (docs/cifar10.md)."""
RECIPE = [
    *("--recipe", "small-data", "--batch-size", "128", "--lr", "2e-3", "--weight-decay", "0.05"),
    *("--warmup-epochs", "0.3", "--clip-grad", "1", "--crop-scale", "0.6,1", "--hflip", "0.5"),
    *("--label-smoothing", "0.1", "--mixup", "0", "--cutmix", "0", "--randaugment", "none"),
    *("--random-erasing", "0", "--drop-path", "0"),
]
"""The 20-minute recipe of docs/cifar10.md, without the model and the budget."""
SMOKE = [*("--dim", "16", "--depth", "1", "--heads", "2", "--mlp-ratio", "2", "--batch-size", "8", "--lr", "1e-3")]
"""Replaces the model size and batch for ``--smoke``: a few seconds on tiny generated data."""


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
    recipe (the smoke check's size), the budget and run flags, the record's flags (unless ``--from recipe``), the
    named levers (``--levers``), then the lever flags, ``--train-args`` last."""
    own = named_model(args.train_args)
    cmd = ["train", "--data", data, "--out", out, *([] if own else ARCH[args.track]), *INPUTS[args.track]]
    cmd += [] if own else SHAPE
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
    if args.start == "record":
        cmd += list(current(args.track).flags)
    cmd += lever_flags(args.track, args.levers or "")
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


def reproduce(args: argparse.Namespace) -> str:
    """This run's speedrun command with every choice spelled out (the seed, where it starts from, the levers);
    ``--from record`` means the record of the day (the JSON's ``record``), ``command`` pins every flag."""
    cmd = ["python", "benchmarks/speedrun.py", "--track", args.track, "--minutes", f"{args.minutes:g}"]
    cmd += ["--smoke"] if args.smoke else ["--data", args.data]
    cmd += ["--seed", str(args.seed), "--from", args.start]
    if args.levers:
        cmd += ["--levers", args.levers]
    for flag, value in levers(args).items():
        cmd += ["--train-args" if flag == "train_args" else flag, str(value)]
    if args.device != "cpu":
        cmd += ["--device", args.device]
    cmd += [] if args.compile == (not args.smoke) else ["--compile" if args.compile else "--no-compile"]
    cmd += ["--threads", str(args.threads)] if args.threads else []
    return shlex.join(cmd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--track", choices=list(TRACKS), default=None, help="required (unless --records)")
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
    p.add_argument(
        "--levers",
        default=None,
        metavar="A,B",
        help="named levers added to the recipe (issue 38; docs/speedrun.md): cct, seq-pool, muon, whiten, tta-flip, "
        "tta-flip-last, ema[=D], mpp[=F]",
    )
    p.add_argument("--token-drop", type=float, default=None, help="lever: vitlab train --token-drop")
    p.add_argument("--token-drop-until", type=float, default=None, help="lever: vitlab train --token-drop-until")
    p.add_argument("--res-schedule", default=None, help="lever: vitlab train --res-schedule (e.g. 24:0.5,32:1.0)")
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
    p.add_argument("--records", action="store_true", help="print docs/speedrun.md's records and levers tables")
    args = p.parse_args(argv)
    if args.records:
        print(records_markdown() + "\n" + levers_markdown(), end="")
        return 0
    if args.track is None:
        p.error("--track is required")
    if args.minutes is None:
        args.minutes = 0.1 if args.smoke else 20.0
    if args.compile is None:
        args.compile = not args.smoke  # as docs/cifar10.md (1.17x faster steps on the CPU)
    if not args.smoke and not args.data:
        p.error("--data DIR is required (or --smoke)")
    try:
        lever_flags(args.track, args.levers or "")
    except ValueError as e:
        p.error(str(e))
    if args.baseline and (args.track != "vit" or levers(args) or args.levers or args.device != "cpu"):
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
        "named_levers": [x.strip() for x in (args.levers or "").split(",") if x.strip()],
        "record": None if args.baseline or args.start != "record" else list(current(args.track).flags),
        "hardware_verified": args.device == "cpu",
        "baseline": args.baseline,
        "command": shown,
        "reproduce": shown if args.baseline else reproduce(args),
    }
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time to accuracy: train CIFAR-10 (or any ImageFolder) from scratch for a fixed wall budget with ``vitlab train
--time-budget`` and report the test top-1 it reached (the rules and the records: docs/speedrun.md). Two tracks:

- ``vit``: the pure ViT, patch embedding as in Eq. 1 (4x4 patches of the 32 px images, no convolutional stem);
- ``hybrid``: a convolutional stem before the Transformer (Sec. 3.1): the R+Ti/16 ResNet stem with 1x1 patches.

Each runs the track's recipe (``docs/cifar10.md``: width 128, depth 6, 4 heads, MLP ratio 2, GAP, sine-cosine
position embeddings, AdamW 2e-3, warmup + cosine planned for the budget, crop + flip, label smoothing 0.1) plus, by
default, the flags of the track's current record (:data:`RECORDS`, read from ``speedrun_records.json``), so that
``python benchmarks/speedrun.py --track T --minutes 20 --data DIR`` re-runs the record; ``--from recipe`` starts from
the bare recipe instead. Levers are added after the record's flags: ``--levers a,b`` names those of issue 38
(:data:`LEVERS`, read from ``speedrun_levers.json``: cct, seq-pool, muon, whiten, tta-flip, tta-flip-last, ema, mpp),
then the flags ``--token-drop``, ``--token-drop-until``, ``--res-schedule``, and any other ``vitlab train`` flag
through ``--train-args``, last, so that a run with a lever and one without differ in nothing else; a ``--model`` in
``--train-args`` replaces the track's model and shape (the name's own shape holds unless ``--train-args`` sets one).
The last stdout line is one JSON object: ``track, minutes, top1, top5, steps, images_per_sec, wall_s, device,
minutes_to, levers, named_levers, record, command, reproduce``; ``minutes_to``: training minutes to 60%, 70% and
80% test top-1 (``command``: the exact ``vitlab train`` command line; ``reproduce``: this run's speedrun command with
every choice spelled out). ``--baseline timm`` runs a plain timm script of the same model and recipe for the same
budget instead (``speedrun_timm.py``, in a process of its own); ``--records`` prints docs/speedrun.md's records and
levers tables, from the two data files.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import Stopwatch, tiny_data

HERE = Path(__file__).resolve().parent

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


# -- the records and the levers: data in speedrun_records.json and speedrun_levers.json ------------------------------

RECORDS_FILE = HERE / "speedrun_records.json"
"""The measured records (docs/speedrun.md, "Records"): the default recipe of each track comes from it, and the page's
tables are :func:`records_markdown` of it (``--records`` prints them; tests/test_speedrun.py checks the page holds
them verbatim)."""
LEVERS_FILE = HERE / "speedrun_levers.json"
"""The named levers of issue 38 (docs/speedrun.md, "The levers"): what ``--levers a,b`` adds, and what each gave."""
MAX_DATA_BYTES = 1 << 20
"""The most bytes read of either file."""


@dataclass(frozen=True)
class Record:
    """A measured result on 2 CPU cores: the track, the ``--minutes`` budget, the ``vitlab train`` flags it adds
    over the track's recipe, the test top-1 of each run (%, seeds 0, 1, ...), when and on which commits it was run,
    and the command that ran it (``--seed S``: each run's seed); the :data:`MACHINES` key it ran on and, where that
    is not the previous record's machine, ``against``: the previous record's command run there beside it (seeds
    0, 1), the result it beat."""

    track: str
    minutes: float
    flags: tuple[str, ...]
    runs: tuple[float, ...]
    date: str
    commits: str
    command: str
    note: str = ""
    machine: str = "Intel Xeon"
    against: tuple[float, ...] = ()

    @property
    def top1(self) -> float:
        """The mean of the runs (%)."""
        return _mean(self.runs)

    @property
    def verified(self) -> bool:
        """Two runs or more (the rule: two seeds, their mean)."""
        return len(self.runs) >= 2


@dataclass(frozen=True)
class Lever:
    """A named lever of issue 38: the ``vitlab train`` flags it adds (``value``: the last flag's value, which
    ``name=V`` replaces), the tracks it applies to, what it is, and what its 20-minute runs gave (``measured``:
    track -> the result in a few words, docs/speedrun.md has the runs; a track not there is not yet measured)."""

    flags: tuple[str, ...]
    tracks: tuple[str, ...]
    what: str
    value: bool = False
    measured: tuple[tuple[str, str], ...] = ()


def read_data(path: Path) -> dict:
    """One of the two data files: a JSON object (its ``about`` says what it holds), at most :data:`MAX_DATA_BYTES`."""
    with path.open(encoding="utf-8") as f:
        text = f.read(MAX_DATA_BYTES + 1)
    if len(text) > MAX_DATA_BYTES:
        raise SystemExit(f"speedrun: {path}: larger than {MAX_DATA_BYTES} bytes")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SystemExit(f"speedrun: {path}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise SystemExit(f"speedrun: {path}: not a JSON object")
    return data


def _records(rows: list[dict]) -> tuple[Record, ...]:
    out = []
    for i, row in enumerate(rows):
        try:
            tuples = {k: tuple(row[k]) for k in ("flags", "runs", "against") if k in row}
            out.append(Record(**{**row, **tuples, "minutes": float(row["minutes"])}))
        except (KeyError, TypeError, ValueError) as e:
            raise SystemExit(f"speedrun: {RECORDS_FILE}: record {i + 1}: {e}") from None
    return tuple(out)


def _levers(rows: dict[str, dict]) -> dict[str, Lever]:
    out = {}
    for name, row in rows.items():
        try:
            tuples = {k: tuple(row[k]) for k in ("flags", "tracks")}
            out[name] = Lever(**{**row, **tuples, "measured": tuple(row.get("measured", {}).items())})
        except (KeyError, TypeError) as e:
            raise SystemExit(f"speedrun: {LEVERS_FILE}: lever {name!r}: {e}") from None
    return out


def _field(book: dict, key: str, path: Path) -> Any:
    if key not in book:
        raise SystemExit(f"speedrun: {path}: no {key!r}")
    return book[key]


_BOOK, _LEVER_BOOK = read_data(RECORDS_FILE), read_data(LEVERS_FILE)
DATA: str = _field(_BOOK, "data", RECORDS_FILE)
"""The data folder the records' commands name (CIFAR-10 as an ImageFolder: ``train/`` 50,000, ``test/`` 10,000)."""
TRACKS: dict[str, str] = _field(_BOOK, "tracks", RECORDS_FILE)
"""The CPU tracks (2 cores) and what each allows; the GPU class runs the same tracks with ``--device cuda``."""
RECORD_MINUTES = float(_field(_BOOK, "record_minutes", RECORDS_FILE))
"""The budget a track's current record is held at; rows at other budgets are reference points."""
MACHINES: dict[str, str] = _field(_BOOK, "machines", RECORDS_FILE)
"""The 2-core machines records were set on (torch's default two threads, the machine otherwise idle)."""
RECORDS = _records(_field(_BOOK, "records", RECORDS_FILE))
"""Every measured record, oldest first within a track and budget (the rows of docs/speedrun.md's "Measurements")."""
LEVERS = _levers(_field(_LEVER_BOOK, "levers", LEVERS_FILE))
"""The levers ``--levers a,b`` adds, in this order, after the record's flags."""


def current(track: str) -> Record:
    """The track's current record: the newest verified one at :data:`RECORD_MINUTES` (what a run without ``--from
    recipe`` adds to the recipe, at any budget). A record enters only when it beats the one before it on the same
    machine (:func:`beaten`) by 0.1 points or more, so the newest holds, whatever its machine's pace."""
    return [r for r in RECORDS if r.track == track and r.minutes == RECORD_MINUTES and r.verified][-1]


def beaten(record: Record) -> tuple[float, ...]:
    """The runs ``record`` beat: the previous verified record's of its track at :data:`RECORD_MINUTES` on its own
    machine, or that record's command run beside it (``against``) on another; () for the first."""
    before = [r for r in RECORDS[: RECORDS.index(record)] if (r.track, r.minutes) == (record.track, record.minutes)]
    before = [r for r in before if r.verified]
    if not before:
        return ()
    return record.against if record.machine != before[-1].machine else before[-1].runs


def adds(record: Record) -> tuple[str, ...]:
    """The flags ``record`` adds over the previous record of its track and budget (over the recipe: all its own)."""
    before = [r for r in RECORDS[: RECORDS.index(record)] if (r.track, r.minutes) == (record.track, record.minutes)]
    prev = _pairs(before[-1].flags) if before else []
    return tuple(x for pair in _pairs(record.flags) if pair not in prev for x in pair)


def _mean(runs: tuple[float, ...]) -> float:
    return round(sum(runs) / len(runs) + 1e-9, 2)  # half up, as the page's means


def _pairs(flags: tuple[str, ...]) -> list[tuple[str, ...]]:
    """``--flag value`` pairs (a flag without a value alone)."""
    out: list[tuple[str, ...]] = []
    for x in flags:
        if x.startswith("--") or not out:
            out.append((x,))
        else:
            out[-1] = (*out[-1], x)
    return out


def records_markdown() -> str:
    """docs/speedrun.md's records tables, one per track (the current record in bold)."""
    out = []
    for track, title in TRACKS.items():
        best = current(track)
        there = f"; the previous record's command gives {_mean(best.against):.2f}% there" if best.against else ""
        out += [
            f"**{title}.** Current record: **{best.top1:.2f}%** in {best.minutes:g} minutes, on "
            f"{MACHINES[best.machine]}{there}.",
            "",
        ]
        out += [
            "| budget | test top-1, mean | runs | flags over the recipe | adds | machine | date | commits | command |"
        ]
        out += ["|---:|---:|---|---|---|---|---|---|---|"]
        for r in sorted(
            (r for r in RECORDS if r.track == track), key=lambda r: (r.minutes != RECORD_MINUTES, -r.minutes)
        ):
            top1 = f"**{r.top1:.2f}%**" if r is best else f"{r.top1:.2f}%"
            runs = " / ".join(f"{x:.2f}" for x in r.runs) + ("" if r.verified else f" ({r.note})")
            if r.against:
                runs += " (over " + " / ".join(f"{x:.2f}" for x in r.against) + ": the previous record's command there)"
            new = " ".join(adds(r)) or "-"
            out += [
                f"| {r.minutes:g} min | {top1} | {runs} | `{' '.join(r.flags)}` | `{new}` | {r.machine} | {r.date} | "
                f"{r.commits} | "
                f"`{r.command}` |"
            ]
        out += [""]
    return "\n".join(out).rstrip() + "\n"


def lever_flags(track: str, spec: str) -> list[str]:
    """The ``vitlab train`` flags of ``--levers spec`` (``a,b,mpp=0.2``) on ``track``; ValueError: the line that
    says which lever does not exist or apply."""
    names = [x.strip() for x in spec.split(",") if x.strip()]
    given = {n.partition("=")[0] for n in names}
    if {"tta-flip", "tta-flip-last"} <= given:
        raise ValueError("--levers: tta-flip and tta-flip-last are two values of --tta: give one")
    flags: list[str] = []
    for item in names:
        name, eq, value = item.partition("=")
        lever = LEVERS.get(name)
        if lever is None:
            raise ValueError(f"--levers: no lever {name!r} (known: {', '.join(LEVERS)})")
        if track not in lever.tracks:
            raise ValueError(f"--levers: {name} does not apply to the {track} track (only {', '.join(lever.tracks)})")
        if name == "whiten" and track == "hybrid" and "cct" not in given:
            raise ValueError(
                "--levers: whiten on the hybrid track needs cct (the ResNet stem standardises its weights)"
            )
        if eq and not lever.value:
            raise ValueError(f"--levers: {name} takes no value")
        flags += [*lever.flags[:-1], value] if eq else list(lever.flags)
    return flags


def levers_markdown() -> str:
    """docs/speedrun.md's "The levers": each lever, what it adds, the command of each run and what the runs gave."""
    out = ["| lever | `vitlab train` flags | what it is | commands (seeds S = 0, 1) | measured at 20 minutes |"]
    out += ["|---|---|---|---|---|"]
    for name, lever in LEVERS.items():
        cmds = []
        for track in lever.tracks:
            extra = "cct,whiten" if name == "whiten" and track == "hybrid" else name
            cmds += [
                f"`python benchmarks/speedrun.py --track {track} --minutes 20 --data {DATA} --levers {extra} --seed S`"
            ]
        got = dict(lever.measured)
        runs = "<br>".join(f"{t}: {got.get(t, 'not yet')}" for t in lever.tracks)
        out += [f"| `{name}` | `{' '.join(lever.flags)}` | {lever.what} | {'<br>'.join(cmds)} | {runs} |"]
    return "\n".join(out) + "\n"


# -- the run ---------------------------------------------------------------------------------------------------------


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


def run_timm_baseline(data: str, args: argparse.Namespace) -> dict | None:
    """``--baseline timm``: the plain timm script (``speedrun_timm.py``) in a process of its own for the budget; its
    last stdout line, the result (None, after saying so, when it failed)."""
    cmd = [sys.executable, str(HERE / "speedrun_timm.py"), "--data", data, "--minutes", repr(args.minutes)]
    cmd += ["--seed", str(args.seed), "--threads", str(args.threads), *(["--smoke"] if args.smoke else [])]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        print(f"speedrun: the timm script exited with {proc.returncode}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
            shown = "python benchmarks/speedrun.py " + shlex.join(argv if argv is not None else sys.argv[1:])
            print(shown, flush=True)
            s = run_timm_baseline(data, args)
            if s is None:
                return 1
            rows, wall = s["rows"], s["wall_s"]
        else:
            cmd = train_command(args, data, out)
            shown = "vitlab " + shlex.join(cmd)
            print(shown, flush=True)
            clock = Stopwatch()
            rc = subprocess.call([sys.executable, "-m", "vitlab", *cmd], env={**os.environ, "PYTHONUNBUFFERED": "1"})
            wall = clock.elapsed()
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

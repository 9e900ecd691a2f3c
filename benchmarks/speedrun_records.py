"""The speedrun's records and levers (docs/speedrun.md, "Records" and "The levers"): one table of the
measured records per track, from which ``speedrun.py`` takes each track's default recipe and docs/speedrun.md its
tables (``python benchmarks/speedrun.py --records`` prints them; tests/test_speedrun.py checks that the page holds
them verbatim), and the named levers of issue 38 that ``speedrun.py --levers`` adds to a track's recipe."""

from __future__ import annotations

from dataclasses import dataclass

DATA = "../shared/data/cifar10"
"""The data folder the records' commands name (CIFAR-10 as an ImageFolder: ``train/`` 50,000, ``test/`` 10,000)."""
TRACKS = {
    "vit": "Pure ViT (`--track vit`): 4x4 patches, no convolution beyond the linear patch embedding of Eq. 1",
    "hybrid": "Hybrid (`--track hybrid`): a convolutional stem before the Transformer (Sec. 3.1; any vitlab stem)",
}
"""The CPU tracks (2 cores) and what each allows; the GPU class runs the same tracks with ``--device cuda``."""
RECORD_MINUTES = 20.0
"""The budget a track's current record is held at; rows at other budgets are reference points."""
MACHINES = {
    "Intel Xeon": "a 2-vCPU KVM guest, Intel Xeon with AVX-512",
    "AMD EPYC": "a 2-vCPU KVM guest, AMD EPYC with AVX-512",
}
"""The 2-core machines records were set on (torch's default two threads, the machine otherwise idle)."""


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


def _cmd(track: str, minutes: int, flags: str) -> str:
    """The command of a record: from the bare recipe (what every run was before records became the default), so
    that it reproduces its own row whatever the current record."""
    speedrun = f"python benchmarks/speedrun.py --track {track} --minutes {minutes} --data {DATA} --from recipe"
    return f"{speedrun} {flags} --seed S"


_TD, _RS = ("--token-drop", "0.5"), ("--res-schedule", "24:0.5,32:1.0")
RECORDS: tuple[Record, ...] = (
    Record("vit", 20, _TD, (70.45, 70.35), "2026-11-24", "2fcd66f", _cmd("vit", 20, "--token-drop 0.5")),
    Record(
        "vit",
        20,
        (*_TD, *_RS),
        (71.48, 71.48),
        "2026-11-24",
        "8466026, d38f433",
        _cmd("vit", 20, "--token-drop 0.5 --res-schedule 24:0.5,32:1.0"),
    ),
    Record(
        "vit",
        20,
        (*_TD, *_RS, "--optimizer", "muon"),
        (75.89, 75.38),
        "2026-11-28",
        "b87cca9",
        _cmd("vit", 20, "--token-drop 0.5 --res-schedule 24:0.5,32:1.0 --levers muon"),
        machine="AMD EPYC",
        against=(67.70, 66.74),
    ),
    Record(
        "vit",
        20,
        (*_TD, *_RS, "--optimizer", "muon", "--tta", "flip-last"),
        (76.04, 76.24),
        "2026-11-28",
        "01de4ce",
        _cmd("vit", 20, "--token-drop 0.5 --res-schedule 24:0.5,32:1.0 --levers muon,tta-flip-last"),
        machine="AMD EPYC",
    ),
    Record(
        "vit",
        20,
        (*_TD, *_RS, "--optimizer", "muon", "--tta", "flip-last", "--whiten-init"),
        (76.67, 76.92),
        "2026-11-28",
        "01de4ce",
        _cmd("vit", 20, "--token-drop 0.5 --res-schedule 24:0.5,32:1.0 --levers muon,tta-flip-last,whiten"),
        machine="AMD EPYC",
    ),
    Record("vit", 10, _TD, (64.57, 63.00), "2026-11-24", "3d73776, bf92c09", _cmd("vit", 10, "--token-drop 0.5")),
    Record(
        "vit",
        5,
        (*_TD, *_RS),
        (59.14, 57.93),
        "2026-11-24",
        "e07f6fe",
        _cmd("vit", 5, "--token-drop 0.5 --res-schedule 24:0.5,32:1.0"),
    ),
    Record(
        "vit",
        5,
        (*_TD, *_RS, "--optimizer", "muon"),
        (62.63, 63.43),
        "2026-11-28",
        "b87cca9",
        _cmd("vit", 5, "--token-drop 0.5 --res-schedule 24:0.5,32:1.0 --levers muon"),
        machine="AMD EPYC",
        against=(54.03, 54.73),
    ),
    Record(
        "hybrid", 20, _TD, (74.49, 74.69), "2026-11-24", "2299fef to beff335", _cmd("hybrid", 20, "--token-drop 0.5")
    ),
    Record(
        "hybrid",
        20,
        (*_TD, "--tta", "flip-last"),
        (70.19, 70.75),
        "2026-11-28",
        "1ee9488",
        _cmd("hybrid", 20, "--token-drop 0.5 --levers tta-flip-last"),
        machine="AMD EPYC",
        against=(69.69, 69.76),
    ),
    Record(
        "hybrid",
        20,
        (*_TD, "--tta", "flip-last", "--optimizer", "muon"),
        (78.31, 79.42),
        "2026-11-28",
        "7506d1b",
        _cmd("hybrid", 20, "--token-drop 0.5 --levers tta-flip-last,muon"),
        machine="AMD EPYC",
    ),
    Record(
        "hybrid",
        40,
        _TD,
        (77.43,),
        "2026-11-24",
        "bcb8b85",
        _cmd("hybrid", 40, "--token-drop 0.5"),
        note="one run, seed 0, so no verified record; it trained 34 of its 40 minutes (an epoch-end cut)",
    ),
    Record("hybrid", 10, _TD, (69.16, 68.63), "2026-11-24", "3d73776, ef27efb", _cmd("hybrid", 10, "--token-drop 0.5")),
    Record(
        "hybrid",
        5,
        _TD,
        (63.96, 63.61),
        "2026-11-24",
        "2299fef to beff335; bcb8b85",
        _cmd("hybrid", 5, "--token-drop 0.5"),
    ),
)
"""Every measured record, oldest first within a track and budget (the rows of docs/speedrun.md's "Measurements")."""


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


LEVERS = {
    "cct": Lever(
        ("--model", "vit_cct7_3x2", "--patch-size", "1"),
        ("hybrid",),
        "CCT's convolutional tokenizer (Hassani et al. 2021: two 3x3 convolutions with 3x3/2 max-pools, an 8 x 8 "
        "grid of tokens at 32 px) in place of the ResNet stem, at the recipe's width, depth, pooling and position "
        "embeddings",
        measured=(
            (
                "hybrid",
                "lost, -4.8: 64.96% (65.10 / 64.82) against the record's recipe at 69.73% (69.69 / "
                "69.76), 2026-11-28; 1.6x the step time",
            ),
        ),
    ),
    "seq-pool": Lever(
        ("--pool", "seq"),
        ("vit", "hybrid"),
        "CCT's sequence pooling instead of GAP",
        measured=(
            (
                "hybrid",
                "lost, -0.62: 69.11% (69.59 / 68.63) against the record's recipe at 69.73% (69.69 / 69.76), 2026-11-28",
            ),
        ),
    ),
    "muon": Lever(
        ("--optimizer", "muon"),
        ("vit", "hybrid"),
        "Muon (torch.optim.Muon, its update scaled to AdamW's RMS) for the encoder blocks' matrices, AdamW for the "
        "rest, at the recipe's LR",
        measured=(
            (
                "vit",
                "won, +8.42: 75.64% (75.89 / 75.38) against the record's command at 67.22% (67.70 / 66.74) on the "
                "same AMD VM, 2026-11-28: a pure ViT record, `tta-flip-last` and `whiten` measured on top of it; at 5 "
                "minutes (seed 0) Muon at LR 1e-3 / 2e-3 / 4e-3 59.42 / 62.63 / 62.97% against AdamW's 54.77 / "
                "54.03 / 46.49%; at each one's best LR, two seeds: Muon 62.83% (4e-3) against AdamW 54.78% (1e-3), "
                "+8.05",
            ),
            (
                "hybrid",
                "won, +8.40: 78.87% (78.31 / 79.42) against the record with `tta-flip-last` at 70.47% "
                "(70.19 / 70.75), 2026-11-28: the hybrid's record since; at LR 3e-3 (set by `--train-args`) "
                "79.82% (79.27 / 80.37) against the record's command at 80.06% (79.66 / 80.45) on the afternoon's "
                "AMD VM: -0.24, not kept",
            ),
        ),
    ),
    "whiten": Lever(
        ("--whiten-init",),
        ("vit", "hybrid"),
        "the first convolution initialised to whiten the training images' patches (hlb-CIFAR10, airbench); on the "
        "hybrid track with `cct` only (the ResNet stem standardises its weights)",
        measured=(
            (
                "vit",
                "won, +0.67: 76.31% (76.25 / 76.37) on top of `muon` against the record at 75.64% (75.89 / 75.38) on "
                "the same AMD VM, 2026-11-28; with `tta-flip-last` 76.80% (76.67 / 76.92), +0.66 over that record "
                "(76.14%): the pure ViT's record since",
            ),
        ),
    ),
    "tta-flip": Lever(
        ("--tta", "flip"),
        ("vit", "hybrid"),
        "test-time flip: the logits of each image and its mirror, in every evaluation (each epoch's and the last)",
        measured=(
            (
                "hybrid",
                "level, +0.05: 69.78% (70.39 / 69.17) against the record's recipe at 69.73% (69.69 / 69.76), "
                "2026-11-28 (a tie: under 0.1); the flipped per-epoch evaluations cost up to 9% of the steps. Not kept",
            ),
        ),
    ),
    "tta-flip-last": Lever(
        ("--tta", "flip-last"),
        ("vit", "hybrid"),
        "test-time flip in the run's last evaluation only (its score): one pass more, the per-epoch evaluations plain",
        measured=(
            (
                "vit",
                "won, +0.50: 76.14% (76.04 / 76.24) on top of `muon` against the record at 75.64% (75.89 / 75.38) on "
                "the same AMD VM, 2026-11-28: a pure ViT record, `whiten` measured on top of it",
            ),
            (
                "hybrid",
                "won, +0.74: 70.47% (70.19 / 70.75) against the record's recipe at 69.73% (69.69 / 69.76), "
                "2026-11-28: a hybrid record, `muon` measured on top of it",
            ),
        ),
    ),
    "mpp": Lever(
        ("--mpp-warmup", "0.1"),
        ("vit",),
        "a masked-patch-prediction warm start (Sec. 4.6) on the same images for the first share of the steps "
        "(`mpp=F`; 0.1 by default, a choice, not a measurement), inside the budget; pixel patches, so the vit "
        "track only",
        value=True,
    ),
}
"""The levers ``--levers a,b`` adds, in this order, after the record's flags."""


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

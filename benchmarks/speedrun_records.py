"""The speedrun's records (docs/speedrun.md, "Records"): one table of the measured records per track, from which
``speedrun.py`` takes each track's default recipe and docs/speedrun.md its tables (``python benchmarks/speedrun.py
--records`` prints them; tests/test_speedrun.py checks that the page holds them verbatim). The named levers are in
``speedrun_levers``."""

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

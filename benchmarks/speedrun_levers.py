"""The named levers of issue 38 (docs/speedrun.md, "The levers"): what ``speedrun.py --levers a,b`` adds to a
track's recipe, and what each lever's 20-minute runs gave (``python benchmarks/speedrun.py --records`` prints the
table; tests/test_speedrun.py checks that the page holds it verbatim)."""

from __future__ import annotations

from dataclasses import dataclass

from speedrun_records import DATA


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
                "vit",
                "level, -0.05: 76.75% (77.07 / 76.42) on top of the record at 76.80% (76.67 / 76.92) on the same AMD "
                "VM, 2026-11-28, on 4,610 / 4,378 steps against 4,793 / 4,896. Not kept",
            ),
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
            (
                "hybrid",
                "lost, -4.41: 75.65% (75.65 / 75.64) as `cct,whiten` on top of the record's command at 80.06% "
                "(79.66 / 80.45) on the afternoon's AMD VM (these runs that night, 2026-11-28/29): 1.8x the step "
                "time, 1,858 / 2,047 steps against 3,712 / 3,658",
            ),
        ),
    ),
    "tta-flip": Lever(
        ("--tta", "flip"),
        ("vit", "hybrid"),
        "test-time flip: the logits of each image and its mirror, in every evaluation (each epoch's and the last)",
        measured=(
            (
                "vit",
                "lost, -1.64: 75.16% (74.85 / 75.46) on top of the record at 76.80% (76.67 / 76.92) on the same AMD "
                "VM (these runs 2026-11-29, 00:50-01:32 UTC), on 3,755 / 4,063 steps against 4,793 / 4,896: the "
                "score's evaluation is the record's, the flipped per-epoch ones cost 13-15% of the planned steps "
                "(seed 0 also ran in a slow stretch of the VM). Not kept",
            ),
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
    "ema": Lever(
        ("--ema", "0.998"),
        ("vit", "hybrid"),
        "an EMA of the weights, the model evaluated and saved (`ema=D`), its decay set to the run's length: 0.998, "
        "a horizon of 500 steps, a tenth of a 20-minute run's",
        value=True,
        measured=(
            (
                "vit",
                "lost, -1.78: 75.02% (74.76 / 75.28) on top of the record at 76.80% (76.67 / 76.92) on the same AMD "
                "VM, 2026-11-28, on 4,417 / 4,686 steps against 4,793 / 4,896",
            ),
            (
                "hybrid",
                "lost, -1.05: 79.01% (78.81 / 79.21) on top of the record's command at 80.06% (79.66 / 80.45) on the "
                "afternoon's AMD VM (these runs that night, 2026-11-28/29), on 3,534 / 3,321 steps against 3,712 / "
                "3,658",
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
        measured=(
            (
                "vit",
                "level, -0.19: 76.61% (76.82 / 76.40) on top of the record at 76.80% (76.67 / 76.92) on the same AMD "
                "VM, 2026-11-28, on 4,252 / 4,276 steps against 4,793 / 4,896 (after two fixes its first run "
                "found: 73.77% before them). Not kept",
            ),
        ),
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

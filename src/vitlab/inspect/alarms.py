"""Alarms in plain words over a run's attention-health series (:func:`.health.attention_health`, one
record per epoch, oldest first): what went wrong, in which layer, and the flag that helps. Notes, beside
them, say what the series shows that is expected of the run's data rather than a fault (:data:`NOTES`).

Pure functions of the numbers: the thresholds are :class:`AlarmThresholds` (each field says where its
value comes from) and what the run already does is :class:`RunContext`, so an alarm never suggests a
remedy the run already uses. Records are data read back from a run folder: a missing or malformed value
silences the alarm that needs it, it never raises.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALARMS",
    "NOTES",
    "PENDING_FLAGS",
    "SUGGESTED_FLAGS",
    "AlarmThresholds",
    "RunContext",
    "health_alarms",
    "health_notes",
    "named_alarms",
    "named_notes",
]

SUGGESTED_FLAGS = ("--qk-norm", "--lr", "--warmup-epochs", "--reg-tokens", "--model", "--patch-size")
"""The ``vitlab train`` flags the alarms and notes name."""

PENDING_FLAGS: frozenset[str] = frozenset()
"""Of :data:`SUGGESTED_FLAGS`, those ``vitlab train`` does not have yet (none: ``--qk-norm`` and ``--reg-tokens``
came with issue 39)."""


@dataclass(frozen=True)
class AlarmThresholds:
    """When each alarm fires. The papers give the phenomena, not cut-offs; the cut-offs are vitlab's."""

    collapsed_fraction: float = 0.5
    """Entropy collapse: at least this fraction of a layer's heads below the record's ``collapse_threshold``
    (:data:`.health.COLLAPSE_THRESHOLD`, 0.5 nats). Zhai et al. 2023 track each head's entropy and call
    pathologically low values (attention on about one token) collapse; half of a layer's heads is vitlab's
    line between one odd head and a layer gone."""
    logit_floor: float = 100.0
    """Logit growth: a layer's largest attention logit at least this large. Dehghani et al. 2023 (ViT-22B, Sec. 2)
    saw the logits grow without bound, to near one-hot attention, before divergence. A fresh model's are of order 1;
    the floor sits between what the default runs of docs/analyses.md reach as they sharpen their attention and
    what runs with ten times the LR reach on the way to entropy collapse (the numbers and commands are there)."""
    logit_growth: float = 10.0
    """...and, for a model that did not start from its initialisation (a fine-tune, :attr:`RunContext.fresh`
    false), at least this many times its value in the first record: a pre-trained model's logits may start
    large."""
    outlier_ratio: float = 4.0
    """Outlier tokens: a block's largest patch-token norm at least this many times the median. Darcet et al.
    2024 (Fig. 3) find the norms bimodal, the artefact tokens several times the others (about 2% of tokens,
    in large models trained long); at initialisation the ratio is near 1."""
    local_fraction: float = 0.8
    """No local heads: every head of the early layers attends at least this fraction of the uniform-attention
    distance. Raghu et al. 2021 ("Do Vision Transformers See Like Convolutional Neural Networks?", Sec. 4)
    find that ViTs trained on ImageNet alone grow no local heads in their lowest layers, unlike those
    pre-trained on JFT-300M (the paper's Fig. 7)."""
    small_data: int = 1_300_000
    """Training sets smaller than ImageNet-1k (1.28M images) count as small (Raghu et al. 2021)."""
    early_layers: float = 0.25
    """The first quarter of the layers (at least one) are the early ones."""
    min_patches: int = 16
    """No-local-heads needs a grid of at least 4 x 4 patches: on a smaller one local and global are one."""
    min_epochs: int = 3
    """No-local-heads waits this many records, and half the planned epochs when they are known: at
    initialisation every head is near uniform."""
    min_steps: int = 1000
    """...and this many optimizer steps when the run's step is known (:attr:`RunContext.steps`): Raghu et al.
    describe fully trained models, and a run of a few hundred steps (a test's, or ``vitlab train``'s default
    digits run) has not trained long enough to say what its heads became."""


@dataclass(frozen=True)
class RunContext:
    """What a run already does, so that an alarm suggests what it does not."""

    num_train_images: int | None = None
    qk_norm: bool = False
    warmup: bool = False
    reg_tokens: int = 0
    hybrid: bool = False
    patch_size: int | None = None
    embed_dim: int | None = None
    """The model's width and depth, when known: the hybrid stem a remedy names keeps them."""
    depth: int | None = None
    lr: float | None = None
    epochs: int | None = None
    """Planned epochs, when known."""
    steps: int | None = None
    """Optimizer steps the run has taken at the last record, when known."""
    fresh: bool = True
    """The model started from its initialisation (no ``--init``): its logits began of order 1, so reaching
    :attr:`AlarmThresholds.logit_floor` is growth whatever the first record says (an epoch of a high LR can pass the
    floor before the first record)."""


def _floats(rec: Mapping[str, Any], key: str) -> list[float | None] | None:
    """``rec[key]`` as a list of finite floats (None for a missing or non-finite entry), or None."""
    v = rec.get(key) if isinstance(rec, Mapping) else None
    if not isinstance(v, (list, tuple)):
        return None
    out: list[float | None] = []
    for x in v:
        ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        out.append(float(x) if ok else None)
    return out


def _number(rec: Mapping[str, Any], key: str) -> float | None:
    v = rec.get(key) if isinstance(rec, Mapping) else None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _layers(idx: Sequence[int]) -> str:
    names = ", ".join(str(i + 1) for i in idx)
    return f"layer {names}" if len(idx) == 1 else f"layers {names}"


def _or(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _lower_lr(ctx: RunContext) -> str:
    return f"a lower --lr (e.g. {ctx.lr / 2:.3g})" if ctx.lr else "a lower --lr"


def _collapse(history: Sequence[Mapping[str, Any]], ctx: RunContext, th: AlarmThresholds) -> list[str]:
    last = history[-1]
    frac, thr = _floats(last, "collapsed_fraction"), _number(last, "collapse_threshold")
    if frac is None or thr is None:
        return []
    hit = [i for i, f in enumerate(frac) if f is not None and f >= th.collapsed_fraction]
    if not hit:
        return []
    fixes = ([] if ctx.qk_norm else ["--qk-norm"]) + [_lower_lr(ctx)]
    if not ctx.warmup:
        fixes.append("warmup (--warmup-epochs 5)")
    share = ", ".join(f"{frac[i]:.0%}" for i in hit)
    return [
        f"attention entropy collapse in {_layers(hit)}: {share} of the heads attend to about one token "
        f"(mean entropy under {thr:g} nats; Zhai et al. 2023), which comes before loss spikes and divergence; "
        f"try {_or(fixes)}"
    ]


def _logit_growth(history: Sequence[Mapping[str, Any]], ctx: RunContext, th: AlarmThresholds) -> list[str]:
    first, last = _floats(history[0], "max_logit"), _floats(history[-1], "max_logit")
    if last is None or (not ctx.fresh and (first is None or len(history) < 2)):
        return []

    def grew(i: int, b: float | None) -> bool:
        if b is None or b < th.logit_floor:
            return False
        a = first[i] if first is not None and i < len(first) else None
        return ctx.fresh or (a is not None and a > 0 and b >= th.logit_growth * a)

    hit = [i for i, b in enumerate(last) if grew(i, b)]
    if not hit:
        return []
    worst = max(hit, key=lambda i: last[i])  # type: ignore[arg-type,return-value]
    b = last[worst]
    if ctx.fresh:
        how = f"reached {b:,.0f} (of order 1 at initialisation)"
    else:
        a = first[worst]  # type: ignore[index]
        how = f"rose from {a:.3g} to {b:,.0f} ({b / a:.0f}x)"  # type: ignore[operator]
    fix = (
        f"the logits are after qk-norm, whose gains grew: try {_lower_lr(ctx)}"
        if ctx.qk_norm
        else f"try --qk-norm (Dehghani et al. 2023) or {_lower_lr(ctx)}"
    )
    return [
        f"attention logit growth in {_layers(hit)}: the largest q.k logit {how}, pushing the softmax towards "
        f"one-hot; {fix}"
    ]


def _outliers(history: Sequence[Mapping[str, Any]], ctx: RunContext, th: AlarmThresholds) -> list[str]:
    first, last = _floats(history[0], "outlier_ratio"), _floats(history[-1], "outlier_ratio")
    if last is None:
        return []
    before = first if first is not None and len(history) > 1 else [None] * len(last)
    hit = [
        i
        for i, r in enumerate(last)
        if r is not None and r >= th.outlier_ratio and not (i < len(before) and (before[i] or 0) >= th.outlier_ratio)
    ]
    if not hit:
        return []
    worst = max(last[i] for i in hit)  # type: ignore[type-var]
    fix = (
        f"the model already has {ctx.reg_tokens} register token(s): try more (Darcet et al. use up to 16)"
        if ctx.reg_tokens
        else "try --reg-tokens 4 (register tokens, Darcet et al. 2024)"
    )
    return [
        f"outlier tokens in {_layers(hit)}: a patch token's norm reached {worst:.1f}x the median, the high-norm "
        f"artefacts that take over attention maps; {fix}"
    ]


def _hybrid_stem(ctx: RunContext) -> str:
    """The hybrid remedy: the ResNet stem of the paper's R+Ti models before a Transformer of this run's width and
    depth when they are known (a registered hybrid is a larger model, slower per step), else the registered one."""
    if ctx.embed_dim and ctx.depth:
        return (f"a hybrid stem at this width and depth (--model vit_r_ti16 --patch-size 1 --dim {ctx.embed_dim} "
                f"--depth {ctx.depth}, as the speedrun's hybrid track)")  # fmt: skip
    return "a hybrid stem (--model vit_r_ti16 or another vit_r_* name)"


def _no_local_heads(history: Sequence[Mapping[str, Any]], ctx: RunContext, th: AlarmThresholds) -> list[str]:
    n = ctx.num_train_images
    if n is None or n >= th.small_data:
        return []
    need = max(th.min_epochs, math.ceil(ctx.epochs / 2) if ctx.epochs else 0)
    if len(history) < need or (ctx.steps is not None and ctx.steps < th.min_steps):
        return []
    last = history[-1]
    per_head, uniform, grid = last.get("distance_per_head"), _number(last, "uniform_distance"), last.get("grid")
    if not isinstance(per_head, list) or not per_head or uniform is None or uniform <= 0:
        return []
    if not (isinstance(grid, list) and len(grid) == 2 and all(isinstance(g, int) for g in grid)):
        return []
    if grid[0] * grid[1] < th.min_patches:
        return []
    early = per_head[: max(1, round(len(per_head) * th.early_layers))]
    rows = [_floats({"r": row}, "r") for row in early]
    if any(r is None or not r or None in r for r in rows):
        return []
    nearest = min(min(r) for r in rows)  # type: ignore[arg-type,type-var]
    if nearest < th.local_fraction * uniform:
        return []
    fixes = [] if ctx.hybrid else [_hybrid_stem(ctx)]
    if ctx.patch_size and ctx.patch_size > 1:
        fixes.append(f"smaller patches (--patch-size {max(1, ctx.patch_size // 2)})")
    if not fixes:
        return []
    return [
        f"no local heads in {_layers(range(len(early)))} after {len(history)} epochs on {n:,} images: every head "
        f"attends at {nearest / uniform:.0%} or more of the uniform distance ({uniform:.1f} px), as ViTs do on "
        f"small data (Raghu et al. 2021); {_or(fixes)} builds locality into the model, at a cost a short run may "
        f"not repay (docs/analyses.md)"
    ]


ALARMS = {
    "entropy_collapse": _collapse,
    "logit_growth": _logit_growth,
    "outlier_tokens": _outliers,
}
"""Each alarm's name and check, in the order they are reported: a fault of the run, said under the epoch line
where it first fires and again in the end-of-run advice."""

NOTES = {"no_local_heads": _no_local_heads}
"""Each note's name and check: what the series shows that is expected of the run's data, said in the end-of-run
advice only. Early layers without local heads are what Raghu et al. 2021 find for every ViT trained on ImageNet
or less; its remedies add a convolutional stem or tokens, which a short budget may not pay for (docs/analyses.md
measures both outcomes), so it describes the run rather than raising an alarm over it."""


def _named(
    checks: Mapping[str, Any], history: Sequence[Mapping[str, Any]], context: RunContext,
    thresholds: AlarmThresholds | None,
) -> list[tuple[str, str]]:  # fmt: skip
    th = thresholds or AlarmThresholds()
    recs = [r for r in history if isinstance(r, Mapping)]
    if not recs:
        return []
    return [(name, msg) for name, check in checks.items() for msg in check(recs, context, th)]


def named_alarms(
    history: Sequence[Mapping[str, Any]], *, context: RunContext, thresholds: AlarmThresholds | None = None
) -> list[tuple[str, str]]:
    """:func:`health_alarms` with each sentence's alarm name (a key of :data:`ALARMS`): ``[(name, sentence)]``,
    so that a caller can say each alarm once while its numbers change."""
    return _named(ALARMS, history, context, thresholds)


def named_notes(
    history: Sequence[Mapping[str, Any]], *, context: RunContext, thresholds: AlarmThresholds | None = None
) -> list[tuple[str, str]]:
    """The notes (:data:`NOTES`) the series gives, as :func:`named_alarms` gives the alarms."""
    return _named(NOTES, history, context, thresholds)


def health_alarms(
    history: Sequence[Mapping[str, Any]], *, context: RunContext, thresholds: AlarmThresholds | None = None
) -> list[str]:
    """The alarms the attention-health ``history`` (per-epoch :func:`.health.attention_health` records,
    oldest first) raises, one plain sentence each, with the flag that helps; ``[]`` when all is well.

    - *entropy collapse* in a layer (the last record): suggests ``--qk-norm``, a lower ``--lr``, warmup;
    - *logit growth* past a floor (a fine-tune: also a factor over its first record): ``--qk-norm``;
    - *outlier tokens* that appeared during the run: ``--reg-tokens 4``.
    """
    return [msg for _, msg in named_alarms(history, context=context, thresholds=thresholds)]


def health_notes(
    history: Sequence[Mapping[str, Any]], *, context: RunContext, thresholds: AlarmThresholds | None = None
) -> list[str]:
    """The notes the series gives, one plain sentence each, read as :func:`health_alarms` reads it:

    - *no local heads* in the early layers on a small training set, once the run is under way: with a hybrid
      stem or smaller patches as the remedies, whose cost a short budget may not repay.
    """
    return [msg for _, msg in named_notes(history, context=context, thresholds=thresholds)]

"""Attention health while a model trains (issue 39): after each epoch's evaluation,
:func:`vitlab.inspect.attention_health` on a fixed small batch of evaluation images, chosen once, measured on a
plain copy of the trained weights (:func:`plain_copy`: the live model, its modes, hooks and speed paths are never
touched). Its compact record goes into the epoch's ``metrics.jsonl`` row (:mod:`vitlab.train.persist.health`); the
alarms of :func:`vitlab.inspect.alarms.named_alarms` are printed under the epoch line the first time each fires, and the
ones that stand at the end join the run's advice, with the notes (:func:`vitlab.inspect.alarms.named_notes`).

``--watch-attention auto`` (the default) watches while it is cheap: the passes' seconds over the seconds of the
epochs they closed (both timed in this process, so a loaded machine slows both alike) must stay at most
:data:`WATCH_SHARE`; past it, the watch stops for the rest of the run and says so. ``on`` always watches, ``off``
never; under ``--fsdp`` ``auto`` is off (each pass would gather the sharded weights), and ``on`` measures a plain copy
gathered on rank 0's CPU. The measured share is ``summary.json``'s ``attention.overhead``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ...adapters import merged_state_dict
from ...distributed import Dist
from ...inspect.alarms import RunContext, named_alarms, named_notes
from ...inspect.health import attention_health
from ...models import VisionTransformer, ViTConfig
from ..conf.recipes import Recipe
from ..conf.train_config import TrainConfig
from ..persist.health import alarm_history, compact
from ..sizing.steps import RunPlan
from .loaders import FolderLoaders, RunLoaders
from .parallel import full_model

__all__ = [
    "HEALTH_BYTES",
    "HEALTH_IMAGES",
    "WATCH_SHARE",
    "AttentionWatch",
    "health_indices",
    "health_size",
    "measure_epoch",
    "plain_copy",
    "run_context",
]

WATCH_SHARE = 0.05
"""``auto``'s ceiling: the health passes may take at most this share of the time of the epochs they close."""
HEALTH_IMAGES = 16
"""Images of the fixed batch (fewer when the evaluation split, or :data:`HEALTH_BYTES`, has fewer)."""
HEALTH_BYTES = 256 * 2**20
"""At most this many bytes of float32 attention weights for the batch over all layers (the pass keeps every
layer's ``(B, heads, T, T)`` weights): a large model at a high resolution measures fewer images, at least one."""


def health_size(config: ViTConfig, *, available: int) -> int:
    """Images of the batch for a model of ``config``, with ``available`` evaluation images."""
    tokens = config.num_prefix_tokens + config.grid_size[0] * config.grid_size[1]
    per_image = 4 * config.depth * config.num_heads * tokens * tokens
    return max(1, min(HEALTH_IMAGES, available, HEALTH_BYTES // per_image))


def health_indices(available: int, n: int) -> list[int]:
    """``n`` indices spread evenly over ``range(available)`` (a folder's evaluation split is sorted by class)."""
    return sorted({i * available // n for i in range(n)})


def _images(loaders: RunLoaders, config: ViTConfig) -> torch.Tensor | None:
    """The fixed batch: evaluation images of this process's share, transformed as evaluation does, on the CPU;
    tar shards give their first ones (the time budget's probe reads the same)."""
    available = loaders.eval_size if isinstance(loaders, FolderLoaders) else min(loaders.eval_size, HEALTH_IMAGES)
    if available < 1:
        return None
    n = health_size(config, available=available)
    items = [loaders.eval_items(i, i + 1)[0] for i in health_indices(available, n)]
    return torch.stack(items).float()


@dataclasses.dataclass(kw_only=True)
class AttentionWatch:
    """The run's attention health: :meth:`epoch_began` at each epoch's start, :meth:`measure` after its evaluation
    (on the process that writes the outputs), :meth:`summary` and :meth:`alarms` at the end."""

    mode: str
    """``on``, ``off`` or ``auto`` (see the module's notes)."""
    images: torch.Tensor | None
    context: RunContext
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The records so far, as the alarms read them (a resumed run's from its ``metrics.jsonl``)."""
    clock: Callable[[], float] = time.perf_counter
    fired: set[str] = dataclasses.field(default_factory=set)
    health_s: float = 0.0
    epoch_s: float = 0.0
    passes: int = 0
    stopped_after: int | None = None
    """The epoch after which ``auto`` stopped watching (None: it did not)."""
    t_epoch: float | None = None

    @classmethod
    def start(
        cls,
        mode: str,
        *,
        loaders: RunLoaders,
        vit: nn.Module,
        context: RunContext,
        rows: Sequence[dict[str, Any]] = (),
        sharded: bool = False,
    ) -> AttentionWatch:
        """The watch of a run: ``rows`` are its ``metrics.jsonl`` rows so far (a resumed run), ``sharded`` its
        ``--fsdp``; the batch is chosen now, once."""
        if sharded and mode == "auto":
            mode = "off"
        images = _images(loaders, vit.config) if mode != "off" else None
        history = alarm_history(rows)
        fired = {name for name, _ in named_alarms(history, context=context)}  # a resumed run said these already
        return cls(mode=mode if images is not None else "off", images=images, context=context, history=history,
                   fired=fired)  # fmt: skip

    @property
    def due(self) -> bool:
        """Whether this epoch is measured (the same on every process of a run)."""
        return self.mode != "off" and self.stopped_after is None

    def epoch_began(self) -> None:
        self.t_epoch = self.clock()

    def measure(self, vit: nn.Module, *, epoch: int, step: int) -> tuple[dict[str, Any], list[str]]:
        """Measure ``vit`` (the trained ViT, or its gathered copy) at the end of epoch ``epoch`` (step ``step``):
        ``(the row's record, the lines to print under the epoch line)``: alarms that fire for the first time, and
        ``auto`` stopping."""
        t0 = self.clock()
        rec = attention_health(vit, self.images)  # type: ignore[arg-type]
        seconds = self.clock() - t0
        self.passes += 1
        self.health_s += seconds
        self.epoch_s += t0 - (self.t_epoch if self.t_epoch is not None else t0) + seconds
        row = compact(rec, seconds=seconds)
        self.history += alarm_history([{"attention": row}])
        self.context = dataclasses.replace(self.context, steps=step)
        lines = []
        for name, msg in named_alarms(self.history, context=self.context):
            if name not in self.fired:
                self.fired.add(name)
                lines.append(f"alarm: {msg}")
        share = self.overhead
        if self.mode == "auto" and share is not None and share > WATCH_SHARE:
            self.stopped_after = epoch
            lines.append(
                f"attention health: stopped after epoch {epoch}: its passes took {share:.1%} of the epochs' time "
                f"(--watch-attention auto allows {WATCH_SHARE:.0%}); --watch-attention on keeps it"
            )
        return row, lines

    @property
    def overhead(self) -> float | None:
        """The passes' seconds over their epochs' (the pass included), in this process; None before the first."""
        return self.health_s / self.epoch_s if self.passes and self.epoch_s > 0 else None

    def alarms(self) -> list[str]:
        """The alarms the whole series raises (the end-of-run advice)."""
        return [msg for _, msg in named_alarms(self.history, context=self.context)]

    def notes(self) -> list[str]:
        """The notes the whole series gives (the end-of-run advice)."""
        return [msg for _, msg in named_notes(self.history, context=self.context)]

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s ``attention``: the mode, the passes of this process, their images and seconds, the
        measured share of the time (``overhead``), when ``auto`` stopped, the alarms and the notes."""
        share = self.overhead
        return {
            "watch": self.mode,
            "passes": self.passes,
            "images": 0 if self.images is None else int(self.images.shape[0]),
            "seconds": round(self.health_s, 3),
            "overhead": None if share is None else round(share, 4),
            "stopped_after_epoch": self.stopped_after,
            "alarms": self.alarms(),
            "notes": self.notes(),
        }


def run_context(cfg: TrainConfig, recipe: Recipe, *, config: ViTConfig, data: Any, plan: RunPlan) -> RunContext:
    """What the run already does, for the alarms' remedies: its model (``config``), training-set size, warmup, LR
    (``recipe``'s, the one trained with, before the batch scaling), planned epochs and whether it starts from
    initialisation."""
    try:
        n: int | None = len(data.train)
    except TypeError:  # a stream of unknown length
        n = None
    return RunContext(
        num_train_images=n,
        qk_norm=config.qk_norm,
        warmup=bool(plan.warmup_steps),
        reg_tokens=config.reg_tokens,
        hybrid=config.hybrid_layers is not None or config.stem != "patch",
        patch_size=config.patch_size,
        embed_dim=config.embed_dim,
        depth=config.depth,
        lr=recipe.lr,
        epochs=plan.epochs,
        fresh=not cfg.init,
    )


def plain_copy(vit: nn.Module) -> nn.Module:
    """A plain :class:`~vitlab.models.VisionTransformer` of ``vit``'s configuration (under any ``torch.compile`` or
    DDP wrapper; ``vitlab.accel``'s class gives the plain one) holding a detached copy of its weights, on their
    device: built on the meta device and handed the copied tensors, so no initialisation runs
    and the run's random state is untouched. Adapters (``--tune lora``, ``ssf``) are merged into the copy's weights."""
    for _ in range(4):  # the ViT under a compile or DDP wrapper
        inner = getattr(vit, "_orig_mod", None) or getattr(vit, "module", None)
        if not isinstance(inner, nn.Module):
            break
        vit = inner
    cls = VisionTransformer if isinstance(vit, VisionTransformer) else type(vit)  # not accel's speed paths
    with torch.device("meta"):
        copy = cls(vit.config)
    state = merged_state_dict(vit)  # a LoRA- or SSF-wrapped model's weights merged: the plain model's
    copy.load_state_dict({k: v.detach().clone() for k, v in state.items()}, assign=True)
    return copy.eval()


def measure_epoch(
    watch: AttentionWatch, vit: nn.Module, *, dist: Dist, sharded: bool, epoch: int, step: int
) -> tuple[dict[str, Any] | None, list[str]]:
    """:meth:`AttentionWatch.measure` when the epoch is due, on the process that writes the outputs; with
    ``sharded`` (``--fsdp``) every process takes part in gathering the plain copy (a collective); otherwise the
    main process measures a :func:`plain_copy`."""
    if not watch.due:
        return None, []
    model = full_model(vit, dist) if sharded else (plain_copy(vit) if dist.is_main else None)
    if model is None:
        return None, []
    return watch.measure(model, epoch=epoch, step=step)

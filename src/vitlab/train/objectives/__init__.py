"""WHAT a run learns (timm's ``task/``): one :class:`~vitlab.train.objectives.base.Objective` per objective, which
builds the trained module around the ViT, computes the loss, evaluates, says what ``model/`` saves and what it adds
to the memory estimate. The loop, the time budget's probe, the memory estimate and the outputs ask it.

- :class:`~.classify.Classify`: the paper's classification (cross-entropy, label smoothing, MixUp/CutMix targets);
- :class:`~.mpp.MPP`: masked patch prediction (Sec. 4.6), labels unused;
- :class:`~.distill.Distill`: classification with a frozen teacher (DeiT), when ``--teacher`` is given;
- :class:`~.warmstart.WarmStart`: classification after a masked-patch-prediction warm start (``--mpp-warmup``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..conf.train_config import objective_name
from .base import Objective
from .classify import Classify
from .distill import Distill
from .mpp import MPP
from .warmstart import WarmStart

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ...data.sources import DataSplits
    from ..conf.recipes import Recipe
    from ..conf.train_config import TrainConfig

__all__ = ["MPP", "Classify", "Distill", "Objective", "WarmStart", "build_objective", "objective_for"]

_BY_NAME: dict[str, type[Objective]] = {"classify": Classify, "mpp": MPP, "distill": Distill, "warmstart": WarmStart}


def objective_for(cfg: TrainConfig) -> type[Objective]:
    """The objective ``cfg`` trains (its class: what is known before the data), by
    :func:`~vitlab.train.conf.train_config.objective_name`."""
    return _BY_NAME[objective_name(cfg)]


def build_objective(
    cfg: TrainConfig, recipe: Recipe, data: DataSplits, *, device: torch.device, teacher: nn.Module | None = None
) -> Objective:
    """The objective of the run ``cfg`` on ``data``, with the ``recipe`` it trains with (its
    :class:`~vitlab.train.sizing.Sizing`'s: the label smoothing and evaluation are read here); a distillation
    ``teacher`` (:func:`~.distill.load_teacher`) is moved onto ``device``."""
    kind = objective_for(cfg)
    if kind is Distill:
        return Distill.build(cfg, recipe, data, device=device, teacher=teacher)
    if kind is MPP:
        return MPP(seed=cfg.seed)
    r = recipe
    if kind is WarmStart:
        return WarmStart(
            num_classes=data.num_classes, warmup=r.mpp_warmup, label_smoothing=r.label_smoothing, tta=r.tta
        )
    return Classify(num_classes=data.num_classes, label_smoothing=r.label_smoothing, tta=r.tta)

"""Classification (the paper's objective): cross-entropy of the class logits with the labels, or with
MixUp/CutMix's soft targets, with the recipe's label smoothing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ...evaluate.accuracy import evaluate_batches
from .base import Objective

if TYPE_CHECKING:
    from ...distributed import Dist

__all__ = ["Classify"]


class Classify(Objective):
    """Cross-entropy on the class head; ``num_classes``: the data's (evaluation's top-5 and confusion); ``tta``:
    ``flip`` evaluates each image averaged with its mirror (:func:`~vitlab.evaluate.accuracy.tta_logits`) in every
    evaluation, ``flip-last`` in the run's last one only (the score; the per-epoch ones stay one pass)."""

    name = "classify"

    def __init__(self, *, num_classes: int, label_smoothing: float = 0.0, tta: str = "none") -> None:
        self.num_classes, self.label_smoothing, self.tta = num_classes, label_smoothing, tta

    @property
    def eval_passes(self) -> int:
        return 2 if self.tta == "flip" else 1

    @property
    def last_eval_extra(self) -> float:
        return 1.0 if self.tta == "flip-last" else 0.0

    def loss(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(net(x).float(), y, label_smoothing=self.label_smoothing)

    def evaluate(
        self, net: nn.Module, batches: Iterable[Any], *, device: torch.device, amp_dtype: torch.dtype | None,
        dist: Dist | None = None, last: bool = False, logits: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        tta = "flip" if self.tta == "flip" or (self.tta == "flip-last" and last) else None
        res = evaluate_batches(
            net, batches, num_classes=self.num_classes, device=device, amp_dtype=amp_dtype, dist=dist, tta=tta,
            keep_logits=logits,
        )  # fmt: skip
        return {**res, "tta": tta} if tta else res

"""A masked-patch-prediction warm start inside a classification run: ``vitlab train --mpp-warmup F``.

The small-data ViT literature starts a classifier from a short self-supervised phase on the same images; here the
first fraction ``F`` of the planned optimizer steps trains the paper's masked patch prediction (Sec. 4.6,
:mod:`vitlab.models.mpp`: the 3-bit mean colour of corrupted patches), the rest classification, from the weights
the warm start left, in the same run, plan and budget. The switch is a step of the run's
:class:`~vitlab.train.engine.schedule.StepSchedule` (so that a time budget's re-plan moves it with the run's end,
and a resumed run is in the phase of its step); one optimizer and one learning-rate schedule span both phases.

The trained module (:class:`WarmStartNet`) holds the ViT with its classifier head and the warm start's [mask]
embedding and colour head, so ``last.pt`` resumes either phase; the warm start predicts every patch, so token
dropping is off until it ends. Evaluation is always the classifier's (its top-1 is near chance during the warm
start), and ``model/`` is the ViT.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ...models.mpp import MaskedPatchPrediction, MPPOutput
from .classify import Classify

if TYPE_CHECKING:
    from ...distributed import Dist

__all__ = ["WarmStart", "WarmStartNet"]


class WarmStartNet(nn.Module):
    """The ViT ``model`` inside :class:`~vitlab.models.mpp.MaskedPatchPrediction` (``mpp``; ``mpp.model`` is the
    ViT). ``warm``: forwards are masked patch prediction (an :class:`~vitlab.models.mpp.MPPOutput`), else the ViT's
    class logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.mpp = MaskedPatchPrediction(model, switched_token_drop=True)
        self.warm = False

    @property
    def model(self) -> nn.Module:
        return self.mpp.model

    def no_weight_decay(self) -> set[str]:
        return {f"mpp.{n}" for n in self.mpp.no_weight_decay()}

    def forward(self, x: torch.Tensor) -> Any:
        return self.mpp(x) if self.warm else self.mpp.model(x)


class WarmStart(Classify):
    """Classification after a masked-patch-prediction warm start (see the module's notes); ``warmup``: its share of
    the planned steps."""

    name = "classify"
    leaves_parameters_unused = True  # the colour head in classification, the classifier head in the warm start

    def __init__(self, *, num_classes: int, warmup: float, label_smoothing: float = 0.0, tta: str = "none") -> None:
        super().__init__(num_classes=num_classes, label_smoothing=label_smoothing, tta=tta)
        self.warmup = warmup

    @classmethod
    def wrap(cls, model: nn.Module) -> nn.Module:
        return WarmStartNet(model)

    @classmethod
    def exported(cls, net: nn.Module) -> nn.Module:
        return net.model if isinstance(net, WarmStartNet) else net

    def loss(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = net(x)
        if isinstance(out, MPPOutput):
            return out.loss.float()
        return F.cross_entropy(out.float(), y, label_smoothing=self.label_smoothing)

    def evaluate(
        self, net: nn.Module, batches: Iterable[Any], *, device: torch.device, amp_dtype: torch.dtype | None,
        dist: Dist | None = None, last: bool = False, logits: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        return super().evaluate(self.exported(net), batches, device=device, amp_dtype=amp_dtype, dist=dist, last=last,
                                logits=logits)  # fmt: skip

    def enter(self, net: nn.Module, *, step: int, warm_start: bool) -> str | None:
        was, net.warm = net.warm, warm_start
        if was and not warm_start:
            return f"masked patch prediction (the warm start) ends after step {step}: classification from here"
        return None

    def start_line(self) -> str:
        return (
            f"masked patch prediction (Sec. 4.6) for the first {self.warmup:.0%} of the steps, then classification "
            "from its weights (--mpp-warmup)"
        )

"""What an objective is (timm's ``task/``): the one object the training loop, the time budget's probe, the memory
estimate and the run's ``model/`` ask about what is learned. The loop does not know which objective runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

if TYPE_CHECKING:
    from ...data.sources import DataSplits
    from ...distributed import Dist

__all__ = ["Objective"]


class Objective:
    """One training objective. Class attributes and class methods are what a run needs before the objective is
    built (the data's head, the module around the ViT); an instance (:func:`~vitlab.train.objectives.build_objective`,
    once the data and the recipe are known) computes the loss and evaluates. How much a run gets (its recipe fitted
    to the data, its memory) is :mod:`vitlab.train.sizing`'s, by the objective's name
    (:func:`~vitlab.train.conf.train_config.objective_name`)."""

    name: ClassVar[str]
    uses_labels: ClassVar[bool] = True
    """Whether the labels are learned: the data needs two classes or more, MixUp/CutMix mix them, evaluation
    reports top-1 over classes (and the advice and the accuracy before fine-tuning read it)."""
    steps_as_probed: ClassVar[bool] = True
    """Whether a training step costs what the auto recipe's probe timed, a forward and backward pass of the model
    through a classification loss, so that a time budget's plan may reuse that time
    (:func:`~vitlab.train.sizing.budget.measure_budget`); else the plan times the objective's own step."""
    leaves_parameters_unused: ClassVar[bool] = False
    """Whether a step leaves some of the module's parameters without a gradient (DDP must look for them)."""

    @classmethod
    def head(cls, data: DataSplits) -> tuple[int, list[str]]:
        """``(classes, class names)`` of the ViT's head."""
        return data.num_classes, list(data.class_names)

    @classmethod
    def wrap(cls, model: nn.Module) -> nn.Module:
        """The module the optimiser trains around the ViT ``model`` (the ViT itself unless the objective adds
        parameters)."""
        return model

    @classmethod
    def exported(cls, net: nn.Module) -> nn.Module:
        """The ViT inside ``net`` (what :meth:`wrap` made, or a copy of it): what ``model/`` saves."""
        return net

    def loss(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss of the batch ``(x, y)`` through ``net`` (a float32 scalar; under autocast)."""
        raise NotImplementedError

    def evaluate(
        self, net: nn.Module, batches: Iterable[Any], *, device: torch.device, amp_dtype: torch.dtype | None,
        dist: Dist | None = None, last: bool = False, logits: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """``top1``, ``top5`` and ``loss`` over ``batches`` (and what the figures read: ``confusion``,
        ``per_class``); in DDP every rank passes its shard and the counts are summed. ``last``: the run's last
        evaluation (the one at its plan's last step). ``logits``: also ``logits`` and ``labels`` of the evaluation, in
        its order, where the objective classifies (what the run fits its temperature on:
        :func:`~vitlab.evaluate.calibration.calibrate`); an objective without classes returns none."""
        raise NotImplementedError

    @property
    def eval_passes(self) -> int:
        """Forward passes an evaluation makes of each image (2 with flip TTA): what the time budget's plan
        multiplies its timed evaluation by."""
        return 1

    @property
    def last_eval_extra(self) -> float:
        """What the run's last evaluation costs beyond the others', in evaluations (``--tta flip-last``: its
        mirrored pass, 1): what the time budget's plan keeps back for it."""
        return 0.0

    def enter(self, net: nn.Module, *, step: int, warm_start: bool) -> str | None:
        """Before optimizer step ``step`` (0-based): switch ``net`` (:meth:`wrap`'s module) to what the step
        schedule says the step trains (``warm_start``: the masked-patch-prediction warm start); the line to print
        when that ends here (None: nothing to say)."""
        return None

    def start_line(self) -> str | None:
        """What the run prints about the objective when it starts (None: nothing)."""
        return None

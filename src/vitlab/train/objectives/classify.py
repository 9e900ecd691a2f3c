"""Classification (the paper's objective): cross-entropy of the class logits with the labels, or with
MixUp/CutMix's soft targets, with the recipe's label smoothing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ...capacity import inference_bytes
from ...evaluate.accuracy import evaluate_batches
from ..spec.finetune import fit_finetune
from ..spec.fitting import fit_recipe_to_data
from ..spec.image_size import holds_photos
from .base import Objective

if TYPE_CHECKING:
    from ...data.sources import DataSplits
    from ...models import ViTConfig
    from ..engine.distributed import Dist
    from ..spec.config import TrainConfig
    from ..spec.pace import Pace
    from ..spec.recipes import Recipe

__all__ = ["Classify", "head_bytes"]


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

    @classmethod
    def fit_recipe(
        cls, cfg: TrainConfig, data: DataSplits, *, device_type: str, pace: Pace | None = None,
        init: ViTConfig | None = None, processes: int = 1,
    ) -> TrainConfig:  # fmt: skip
        """The ``auto`` recipe fitted to the data (:func:`~vitlab.train.spec.fitting.fit_recipe_to_data`, from the
        measured ``pace`` when there is one), or with ``--init`` to fine-tuning the ``init`` model
        (:func:`~vitlab.train.spec.finetune.fit_finetune`), or the ``finetune`` recipe's batch to the data; then the
        size the data was stored for."""
        if init is not None and cfg.recipe.name == "auto":
            cfg = fit_finetune(
                cfg, n_train=len(data.train), class_names=list(data.class_names),
                in_chans=data.in_chans, device_type=device_type, init=init, processes=processes,
            )  # fmt: skip
        else:
            cfg = fit_recipe_to_data(
                cfg,
                n_train=len(data.train),
                image_size=tuple(data.image_size),
                num_classes=data.num_classes,
                in_chans=data.in_chans,
                device_type=device_type,
                pace=pace,
                photo_data=holds_photos(data),
            )
        return super().fit_recipe(cfg, data, device_type=device_type)

    @classmethod
    def step_bytes(
        cls, recipe: Recipe, model_config: ViTConfig, *, micro: int, eval_batch: int, bytes_per_value: int,
        num_classes: int, teacher: ViTConfig | None = None,
    ) -> tuple[int, int]:  # fmt: skip
        """The logits, their log-softmax and gradient; MixUp/CutMix's mixed batch and soft targets; a distillation
        teacher's forward pass (its activations, the batch at its size and its logits)."""
        train = micro * num_classes * (bytes_per_value + 8)
        h, w = model_config.img_size
        if recipe.mixup or recipe.cutmix:
            train += micro * (model_config.in_chans * h * w * 4 + 2 * num_classes * 4)
        if teacher is not None:
            train += head_bytes(teacher, micro=micro, bytes_per_value=bytes_per_value, num_classes=num_classes)
        return train, eval_batch * num_classes * 8

    def loss(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(net(x).float(), y, label_smoothing=self.label_smoothing)

    def evaluate(
        self, net: nn.Module, batches: Iterable[Any], *, device: torch.device, amp_dtype: torch.dtype | None,
        dist: Dist | None = None, last: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        tta = "flip" if self.tta == "flip" or (self.tta == "flip-last" and last) else None
        res = evaluate_batches(
            net, batches, num_classes=self.num_classes, device=device, amp_dtype=amp_dtype, dist=dist, tta=tta
        )
        return {**res, "tta": tta} if tta else res


def head_bytes(teacher: ViTConfig, *, micro: int, bytes_per_value: int, num_classes: int) -> int:
    """Bytes of a frozen teacher's forward pass over ``micro`` images: its activations without autograd, the batch
    resized to its input and its logits."""
    h, w = teacher.img_size
    acts = inference_bytes(teacher, img_size=(h, w), batch=micro, bytes_per_value=bytes_per_value)
    return acts + micro * (teacher.in_chans * h * w * 4 + num_classes * 4)

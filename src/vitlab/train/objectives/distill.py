"""Knowledge distillation from a teacher classifier, as DeiT trains (Touvron et al. 2021, "Training
data-efficient image transformers & distillation through attention", Sec. 5).

The teacher is any classifier :func:`vitlab.load` reads (a vitlab run or model folder, a timm state
dict, a public name), on the same classes as the data, frozen in eval mode; it sees the same
(augmented, mixed) images as the student. The loss averages the usual cross-entropy of the class head
with a distillation term (DeiT's ``alpha = 0.5``):

- ``hard``: cross-entropy with the teacher's argmax (DeiT's hard-label distillation, Eq. 3);
- ``soft``: ``tau**2 x KL(softmax(teacher / tau) || softmax(student / tau))`` (Hinton et al. 2015, DeiT's
  Eq. 2), averaged over the batch. DeiT's code divides the summed KL by batch x classes instead, which
  scales this term by ``1 / classes``; vitlab keeps Hinton's per-image mean, so ``tau`` and the
  averaging mean what they say.

With a distillation token (``--distill-token``, :attr:`~vitlab.models.ViTConfig.dist_token`) the
distillation term is on the token's own head ``head_dist`` and the cross-entropy on the class head;
at evaluation the model averages the two heads, as DeiT. Without it the class head takes both terms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ..._text import size_px
from ...errors import VitlabError
from ...resolve import resolve_model
from ..conf.options import OptionError, ref
from .classify import Classify

if TYPE_CHECKING:
    from ...data.sources import DataSplits
    from ..conf.recipes import Recipe
    from ..conf.train_config import TrainConfig

__all__ = ["DISTILL_KINDS", "Distill", "distillation_loss", "load_teacher"]

DISTILL_KINDS = ("hard", "soft")


def distillation_loss(
    out: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    teacher_logits: torch.Tensor,
    target: torch.Tensor,
    *,
    kind: str,
    tau: float = 3.0,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """DeiT's loss: the mean of the cross-entropy of the class logits with ``target`` (labels, or
    MixUp/CutMix's soft targets; with ``label_smoothing``) and the distillation term of ``kind``
    (see the module's text) on the distillation logits. ``out`` is the student's logits, or
    ``(class logits, distillation logits)`` from a student with a distillation token."""
    cls, dist = out if isinstance(out, tuple) else (out, out)
    base = F.cross_entropy(cls.float(), target, label_smoothing=label_smoothing)
    t = teacher_logits.detach().float()
    if kind == "hard":
        kd = F.cross_entropy(dist.float(), t.argmax(dim=1))
    elif kind == "soft":
        log_p = F.log_softmax(dist.float() / tau, dim=1)
        kd = F.kl_div(log_p, F.log_softmax(t / tau, dim=1), reduction="batchmean", log_target=True) * tau * tau
    else:
        raise OptionError(ref("distill"), f" {kind!r}: choose {' or '.join(DISTILL_KINDS)}")
    return (base + kd) / 2


class Distill(Classify):
    """Classification with a frozen teacher (DeiT): the loss of :func:`distillation_loss` on the student's output
    for the batch the teacher sees too. ``token``: the student has a distillation token, whose head takes the
    teacher's target (its training forwards return ``(class logits, distillation logits)``)."""

    steps_as_probed = False  # the teacher's forward pass too: the 1/3 more of a step of the same architecture

    def __init__(
        self, teacher: nn.Module, *, kind: str, tau: float, token: bool = False, spec: str = "teacher",
        num_classes: int, label_smoothing: float = 0.0, tta: str = "none",
    ) -> None:  # fmt: skip
        super().__init__(num_classes=num_classes, label_smoothing=label_smoothing, tta=tta)
        self.teacher = teacher.eval().requires_grad_(False)
        self.kind, self.tau, self.token, self.spec = kind, tau, token, spec
        self.size = tuple(teacher.config.img_size)

    @classmethod
    def build(
        cls, cfg: TrainConfig, recipe: Recipe, data: DataSplits, *, device: torch.device,
        teacher: nn.Module | None = None,
    ) -> Distill:  # fmt: skip
        """The run's distillation with ``recipe``'s label smoothing and evaluation: the ``teacher`` ``--teacher``
        names (None: loaded now, :func:`load_teacher`), checked to classify the data's classes (their number, and
        their names in order where the teacher records them)."""
        teacher = teacher if teacher is not None else load_teacher(cfg.teacher)  # type: ignore[arg-type]
        c, spec, names = teacher.config, cfg.teacher, list(data.class_names)
        theirs = list(getattr(c, "class_names", None) or [])
        if c.num_classes != data.num_classes or (theirs and names and theirs != names):
            raise OptionError(
                ref("teacher"),
                f" {spec}: it classifies {c.num_classes} classes{_some(theirs)}, the data has {data.num_classes}"
                f"{_some(names)}; the teacher must be trained on the same classes, in the same order",
            )
        if c.in_chans != data.in_chans:
            raise OptionError(ref("teacher"), f" {spec}: it takes {c.in_chans}-channel images, the data has "
                              f"{data.in_chans}")  # fmt: skip
        return cls(
            teacher.to(device),
            kind=cfg.distill or "hard",
            tau=cfg.distill_tau,
            token=cfg.distill_token,
            spec=spec,  # type: ignore[arg-type]
            num_classes=data.num_classes,
            label_smoothing=recipe.label_smoothing,
            tta=recipe.tta,
        )

    def teacher_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The teacher's logits for the student's batch, resized (bilinear) to the teacher's input size
        when the two differ; no gradients."""
        with torch.no_grad():
            if tuple(x.shape[-2:]) != self.size:
                x = F.interpolate(x, size=self.size, mode="bilinear", align_corners=False, antialias=True)
            return self.teacher(x)

    def loss(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = net(x)
        teacher = self.teacher_logits(x)
        return distillation_loss(out, teacher, y, kind=self.kind, tau=self.tau, label_smoothing=self.label_smoothing)

    def start_line(self) -> str:
        c = self.teacher.config
        how = "distillation-token head (head_dist)" if self.token else "class head"
        tau = f", tau {self.tau:g}" if self.kind == "soft" else ""
        return (
            f"distillation ({self.kind}{tau}, DeiT) from {self.spec} ({c.name}, {c.num_classes} classes, "
            f"{size_px(c.img_size)}), frozen; the student's {how} takes the teacher's target"
        )


def _some(names: list[str]) -> str:
    return f" ({', '.join(names[:5])}{' ...' if len(names) > 5 else ''})" if names else ""


def load_teacher(spec: str) -> Any:
    """The trained classifier ``spec`` names, by the one model rule (:func:`vitlab.resolve.resolve_model`: a run or
    model folder, a checkpoint file or a public name), with the speed paths, in eval mode. A registered name (an
    untrained architecture), an exported folder and a model with NaN or infinite weights are refused in one line
    naming ``--teacher``."""
    try:
        return resolve_model(spec, fast=True, trained=True, finite=True, option="--teacher")
    except VitlabError as e:
        raise OptionError(ref("teacher"), f" {spec}: {getattr(e, 'problem', None) or e}") from None

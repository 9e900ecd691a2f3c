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

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, VitlabError

if TYPE_CHECKING:
    from .config import TrainConfig

__all__ = ["DISTILL_KINDS", "Distillation", "build_distillation", "distillation_loss"]

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
        raise ConfigError(f"--distill {kind!r}: choose {' or '.join(DISTILL_KINDS)}")
    return (base + kd) / 2


class Distillation:
    """The frozen teacher and the loss: what :func:`~vitlab.train.loop.train_one_epoch` needs to distil."""

    def __init__(self, teacher: nn.Module, *, kind: str, tau: float, spec: str = "teacher") -> None:
        self.teacher = teacher.eval().requires_grad_(False)
        self.kind, self.tau, self.spec = kind, tau, spec
        self.size = tuple(teacher.config.img_size)

    def teacher_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The teacher's logits for the student's batch, resized (bilinear) to the teacher's input size
        when the two differ; no gradients."""
        with torch.no_grad():
            if tuple(x.shape[-2:]) != self.size:
                x = F.interpolate(x, size=self.size, mode="bilinear", align_corners=False, antialias=True)
            return self.teacher(x)

    def loss(
        self,
        out: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        teacher_logits: torch.Tensor,
        target: torch.Tensor,
        *,
        label_smoothing: float = 0.0,
    ) -> torch.Tensor:
        return distillation_loss(
            out, teacher_logits, target, kind=self.kind, tau=self.tau, label_smoothing=label_smoothing
        )

    def line(self, *, token: bool) -> str:
        """The line the run prints when it starts."""
        c = self.teacher.config
        how = "distillation-token head (head_dist)" if token else "class head"
        tau = f", tau {self.tau:g}" if self.kind == "soft" else ""
        return (
            f"distillation ({self.kind}{tau}, DeiT) from {self.spec} ({c.name}, {c.num_classes} classes, "
            f"{c.img_size[0]}x{c.img_size[1]} px), frozen; the student's {how} takes the teacher's target"
        )


def build_distillation(
    cfg: TrainConfig, *, num_classes: int, class_names: list[str], in_chans: int, device: torch.device
) -> Distillation | None:
    """The run's :class:`Distillation` (``None`` without ``--teacher``): the teacher resolved by the one
    rule for a model argument (:func:`vitlab.commands._common.resolve_model`), checked to classify the
    data's classes (their number, and their names in order where the teacher records them)."""
    if cfg.teacher is None:
        return None
    from ..commands._common import resolve_model
    from ..models import list_models
    from ..models.registry import resolve_name

    spec = cfg.teacher
    if not Path(spec).exists() and resolve_name(spec) in list_models():
        raise ConfigError(
            f"--teacher {spec}: a registered name is an untrained architecture; give a trained model "
            "(a run or model folder, a checkpoint file or a public name)"
        )
    try:
        teacher, _ = resolve_model(spec, fast=True)
    except VitlabError as e:
        msg = str(e).replace(f"--model {spec!r}: ", "", 1)
        raise ConfigError(f"--teacher {spec}: {msg}") from None
    c = teacher.config
    names = list(getattr(c, "class_names", None) or [])
    if c.num_classes != num_classes or (names and class_names and names != list(class_names)):
        theirs = f" ({', '.join(names[:5])}{' ...' if len(names) > 5 else ''})" if names else ""
        ours = f" ({', '.join(class_names[:5])}{' ...' if len(class_names) > 5 else ''})" if class_names else ""
        raise ConfigError(
            f"--teacher {spec}: it classifies {c.num_classes} classes{theirs}, the data has {num_classes}{ours}; "
            "the teacher must be trained on the same classes, in the same order"
        )
    if c.in_chans != in_chans:
        raise ConfigError(f"--teacher {spec}: it takes {c.in_chans}-channel images, the data has {in_chans}")
    return Distillation(teacher.to(device), kind=cfg.distill or "hard", tau=cfg.distill_tau, spec=spec)

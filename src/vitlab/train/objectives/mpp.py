"""Masked patch prediction (paper Sec. 4.6, Appendix B.1.2): ``vitlab train --objective mpp``.

The run trains :class:`~vitlab.models.mpp.MaskedPatchPrediction` around a headless ViT: labels are ignored, the
loss is the 512-way cross-entropy of the corrupted patches' 3-bit mean colours, and "top-1" is the
colour-prediction accuracy. Only the wrapped ViT is saved in ``model/`` (the [mask] embedding and the colour head
live in ``last.pt`` for resuming), so ``vitlab finetune --init run/model`` starts from it like from any ViT.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as tdist
from torch import nn

from ...devices import autocast
from ...models.mpp import MaskedPatchPrediction
from .base import Objective

if TYPE_CHECKING:
    from ...data.sources import DataSplits
    from ...distributed import Dist

__all__ = ["MPP", "evaluate_mpp"]


class MPP(Objective):
    """Masked patch prediction; ``seed``: the evaluation's corruption (the same patches every epoch)."""

    name = "mpp"
    uses_labels = False
    leaves_parameters_unused = True  # the ViT's pooling and head

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed

    @classmethod
    def head(cls, data: DataSplits) -> tuple[int, list[str]]:
        return 0, []  # a headless ViT

    @classmethod
    def wrap(cls, model: nn.Module) -> nn.Module:
        return MaskedPatchPrediction(model)

    @classmethod
    def exported(cls, net: nn.Module) -> nn.Module:
        return net.model if isinstance(net, MaskedPatchPrediction) else net

    def loss(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return net(x).loss.float()

    def evaluate(
        self, net: nn.Module, batches: Iterable[Any], *, device: torch.device, amp_dtype: torch.dtype | None,
        dist: Dist | None = None, last: bool = False, logits: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        return evaluate_mpp(net, batches, device=device, amp_dtype=amp_dtype, dist=dist, seed=self.seed)


@torch.no_grad()
def evaluate_mpp(
    net: nn.Module, batches, *, device: torch.device, amp_dtype: torch.dtype | None = None, dist=None, seed: int = 0
) -> dict[str, Any]:
    """Colour-prediction top-1 / top-5 and mean loss over the corrupted patches of ``batches``.

    The corruption is drawn from its own generator seeded with ``seed``: every evaluation of a
    run corrupts the same patches (epochs are comparable) and the global RNG, which resume
    restores exactly, is left untouched. Labels are ignored. In DDP the counts are summed."""
    net.eval()
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(3, dtype=torch.float64)  # top-1 hits, top-5 hits, loss sum
    n = torch.zeros((), dtype=torch.int64)
    for x, _ in batches:
        x = x.to(device, non_blocking=True)
        with autocast(device, amp_dtype):
            out = net(x, generator=gen)
        logits, tgt = out.logits.float()[out.corrupted], out.targets[out.corrupted]
        if tgt.numel() == 0:
            continue
        counts[0] += float((logits.argmax(-1) == tgt).sum())
        counts[1] += float((logits.topk(5, dim=-1).indices == tgt[:, None]).any(-1).sum())
        counts[2] += float(torch.nn.functional.cross_entropy(logits, tgt, reduction="sum"))
        n += tgt.numel()
    if dist is not None and dist.enabled:
        for t in (counts, n):
            tdist.all_reduce(t)
    k = max(int(n), 1)
    return {"top1": float(counts[0]) / k, "top5": float(counts[1]) / k, "loss": float(counts[2]) / k, "count": int(n)}

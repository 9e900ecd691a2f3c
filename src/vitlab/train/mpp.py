"""The masked-patch-prediction objective in the training loop (paper Sec. 4.6, Appendix B.1.2).

``vitlab train --objective mpp`` trains :class:`~vitlab.models.mpp.MaskedPatchPrediction`
around a headless ViT: labels are ignored, the loss is the 512-way cross-entropy of the
corrupted patches' 3-bit mean colours, and "top-1" is the colour-prediction accuracy. Only the
wrapped ViT is saved in ``model/`` (the [mask] embedding and the colour head live in ``last.pt``
for resuming), so ``vitlab finetune --init run/model`` starts from it like from any ViT.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..devices import autocast

__all__ = ["OBJECTIVES", "evaluate_mpp", "unwrap", "wrap"]

OBJECTIVES = ("classify", "mpp")


def wrap(model: nn.Module, objective: str) -> nn.Module:
    """The module the optimiser trains: ``model`` itself, or its MPP wrapper."""
    if objective == "classify":
        return model
    if objective == "mpp":
        from ..models.mpp import MaskedPatchPrediction

        return MaskedPatchPrediction(model)
    from ..errors import ConfigError

    raise ConfigError(f"--objective {objective!r}: choose one of {', '.join(OBJECTIVES)}")


def unwrap(module: nn.Module) -> nn.Module:
    """The ViT inside an objective wrapper (the module itself when there is none)."""
    from ..models.mpp import MaskedPatchPrediction

    return module.model if isinstance(module, MaskedPatchPrediction) else module


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
        logits, tgt = out.logits.float(), out.targets
        if tgt.numel() == 0:
            continue
        counts[0] += float((logits.argmax(-1) == tgt).sum())
        counts[1] += float((logits.topk(5, dim=-1).indices == tgt[:, None]).any(-1).sum())
        counts[2] += float(torch.nn.functional.cross_entropy(logits, tgt, reduction="sum"))
        n += tgt.numel()
    if dist is not None and dist.enabled:
        import torch.distributed as tdist

        for t in (counts, n):
            tdist.all_reduce(t)
    k = max(int(n), 1)
    return {"top1": float(counts[0]) / k, "top5": float(counts[1]) / k, "loss": float(counts[2]) / k, "count": int(n)}

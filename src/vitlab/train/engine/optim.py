"""What changes the weights: optimisers with parameter groups (no weight decay on norms, biases, position
embeddings and the class token, ``model.no_weight_decay()``, as in timm and big_vision; optionally a per-layer
learning rate, layer-wise LR decay, for fine-tuning; or Muon for the encoder's matrices and AdamW for the rest,
:class:`MuonAdamW`), the LR schedule, the gradient scaler and the EMA."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from ...optim_groups import muon_split
from ..conf.options import OptionError, ref
from ..conf.recipes import Recipe
from .schedule import LRFactor

__all__ = ["MuonAdamW", "Optimization", "build_optimization", "build_optimizer", "layer_id", "param_groups"]

_BLOCK = re.compile(r"(?:^|\.)blocks\.(\d+)\.")
_EMBEDDING = ("cls_token", "pos_embed", "patch_embed", "reg_token", "dist_token", "mask_token")


def layer_id(name: str, depth: int) -> int:
    """Where a parameter sits for layer-wise LR decay (BEiT, timm ``param_groups_layer_decay``): 0 for the
    embeddings (patch / hybrid stem, class token, position embeddings), ``i + 1`` for block ``i``, and
    ``depth + 1`` for the final norm and the head (and anything else after the blocks)."""
    m = _BLOCK.search(name)
    if m:
        return int(m.group(1)) + 1
    if name.split(".")[-1] in _EMBEDDING or any(part in _EMBEDDING for part in name.split(".")):
        return 0
    return depth + 1


def param_groups(
    model: nn.Module, weight_decay: float, *, layer_decay: float | None = None, depth: int | None = None
) -> list[dict]:
    """Two groups: decayed matrices, and 1-D tensors / ``no_weight_decay()`` names without decay.

    With ``layer_decay`` (and the model's ``depth``): two such groups per layer, each with an ``lr_scale`` of
    ``layer_decay ** (depth + 1 - layer_id)``: the head 1, block ``i`` ``layer_decay ** (depth - i)``, the
    embeddings ``layer_decay ** (depth + 1)`` (:func:`layer_id`). Frozen parameters are left out."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim <= 1 or name in skip or name.endswith(".bias")
        layer = layer_id(name, depth) if layer_decay is not None and depth is not None else 0
        g = groups.setdefault((layer, no_decay), {"params": [], "weight_decay": 0.0 if no_decay else weight_decay})
        if layer_decay is not None and depth is not None:
            g["lr_scale"] = layer_decay ** (depth + 1 - layer)
        g["params"].append(p)
    if layer_decay is None or depth is None:
        return [groups.get((0, False), _empty(weight_decay)), groups.get((0, True), _empty(0.0))]
    return [groups[k] for k in sorted(groups)]


def _empty(weight_decay: float) -> dict:
    return {"params": [], "weight_decay": weight_decay}


def build_optimizer(model: nn.Module, recipe: Recipe, lr: float) -> torch.optim.Optimizer:
    """``adamw`` / ``adam`` (decoupled weight decay, i.e. AdamW, in both: the paper's "Adam with
    weight decay" scales the decay by the learning rate), ``sgd`` with momentum, or ``muon`` (:class:`MuonAdamW`,
    :func:`_muon_adamw`). Each group starts at ``lr`` times its ``lr_scale``; the schedule then scales every group
    alike."""
    if recipe.optimizer == "muon":
        return _muon_adamw(model, recipe, lr)
    depth = _depth(model) if recipe.layer_decay is not None else None
    groups = param_groups(model, recipe.weight_decay, layer_decay=recipe.layer_decay, depth=depth)
    for g in groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    if recipe.optimizer in ("adamw", "adam"):
        return torch.optim.AdamW(
            groups, lr=lr, betas=recipe.betas, weight_decay=recipe.weight_decay, fused=_fused_ok(model)
        )
    return torch.optim.SGD(groups, lr=lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)


class MuonAdamW(torch.optim.Optimizer):
    """Two optimisers as one: ``torch.optim.Muon`` for the encoder blocks' matrices and AdamW for every other
    parameter (:func:`vitlab.optim_groups.muon_split`). Its ``param_groups`` are the two optimisers' own groups
    (the same dicts), so that one ``LambdaLR`` schedules both, and clipping and a gradient scaler see every
    parameter; its ``state_dict`` holds both optimisers' states (``last.pt`` resumes both)."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer) -> None:
        self.muon, self.adamw = muon, adamw
        every = [p for opt in (muon, adamw) for g in opt.param_groups for p in g["params"]]
        super().__init__(every, {})  # the base class's hooks and bookkeeping; its own group is replaced below
        self._share_groups()

    def _share_groups(self) -> None:
        self.param_groups = [*self.muon.param_groups, *self.adamw.param_groups]

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("MuonAdamW.step takes no closure")
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:  # type: ignore[override]
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:  # type: ignore[override]
        if set(state_dict) != {"muon", "adamw"}:
            raise ValueError("not the state of a Muon + AdamW optimizer")
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self._share_groups()  # loading replaced the optimisers' group dicts


def _muon_adamw(model: nn.Module, recipe: Recipe, lr: float) -> MuonAdamW:
    """Muon (Jordan et al. 2024) for the 2-D weights of the encoder blocks, AdamW (the recipe's betas, with
    :func:`param_groups`' decay split) for the rest, both at ``lr``. Muon's update is scaled to AdamW's RMS
    (``adjust_lr_fn="match_rms_adamw"``; Liu et al. 2025, "Muon is Scalable for LLM Training"), so that one
    learning rate and one weight decay serve both; Muon's momentum is its default, 0.95 (Nesterov)."""
    if not hasattr(torch.optim, "Muon"):
        raise OptionError(ref("recipe.optimizer"), f" muon: this torch ({torch.__version__}) has no torch.optim.Muon;"
                          " upgrade torch, or use adamw")  # fmt: skip
    matrices = [p for _, p in muon_split(model)[0]]
    if not matrices:
        raise OptionError(ref("recipe.optimizer"), " muon: the model has no trainable encoder-block matrix")
    taken = {id(p) for p in matrices}
    groups = [
        {**g, "params": [p for p in g["params"] if id(p) not in taken], "lr": lr}
        for g in param_groups(model, recipe.weight_decay)
    ]
    muon = torch.optim.Muon(matrices, lr=lr, weight_decay=recipe.weight_decay, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW(
        groups, lr=lr, betas=recipe.betas, weight_decay=recipe.weight_decay, fused=_fused_ok(model)
    )
    return MuonAdamW(muon, adamw)


def _depth(model: nn.Module) -> int:
    """The number of transformer blocks of the ViT in ``model`` (itself or wrapped, e.g. for MPP)."""
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "depth"):
            return int(cfg.depth)
    return 0


def _fused_ok(model: nn.Module) -> bool | None:
    """The single-kernel (fused) AdamW when every parameter can use it (CPU/CUDA floats): one pass over all
    parameters instead of torch's default per-tensor loops, whose overhead dominates a small model's step
    (docs/performance.md)."""
    ps = list(model.parameters())
    ok = ps and all(
        p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float16, torch.bfloat16) for p in ps
    )
    return True if ok else None


@dataclass(kw_only=True)
class Optimization:
    """The objects that change the weights, each with its own state in ``last.pt``; ``lr_factor``: the
    learning-rate schedule every parameter group follows (the ``scheduler``'s lambda, which
    :class:`~vitlab.train.engine.schedule.StepSchedule` re-fits)."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    lr_factor: LRFactor
    scaler: torch.amp.GradScaler | None
    ema: AveragedModel | None


def build_optimization(
    net: nn.Module,
    *,
    recipe: Recipe,
    lr: float,
    device: torch.device,
    use_scaler: bool,
    total_steps: int = 0,
    warmup_steps: int = 0,
    lr_factor: LRFactor | None = None,
) -> Optimization:
    """Optimizer at peak ``lr``, its LR schedule (a ``LambdaLR`` stepped once per optimizer step: ``lr_factor``,
    the run's :class:`~vitlab.train.engine.schedule.StepSchedule`'s, or the recipe's over ``total_steps``), a
    GradScaler for float16, the recipe's EMA."""
    optimizer = build_optimizer(net, recipe, lr)
    factor = lr_factor or LRFactor(
        total_steps=total_steps, warmup_steps=warmup_steps, schedule=recipe.schedule, min_ratio=recipe.min_lr_ratio
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    ema = None
    if recipe.ema:
        ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(recipe.ema), use_buffers=True)
    scaler = torch.amp.GradScaler(device.type) if use_scaler else None
    return Optimization(optimizer=optimizer, scheduler=scheduler, lr_factor=factor, scaler=scaler, ema=ema)

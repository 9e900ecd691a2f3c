"""Parameter-efficient fine-tuning whose result is a plain ViT: LoRA (:mod:`.lora`), SSF (:mod:`.ssf`) and bias-only
tuning (BitFit, Ben Zaken et al. 2022), each applied to a model before training and merged out of it after.

Not the paper, so not in :mod:`vitlab.models`: the adapters wrap the model's layers from outside, by their roles in
the encoder blocks (:data:`DEFAULT_TARGETS`: the attention's ``qkv`` and output ``proj``, the MLP's ``fc1`` and
``fc2``; a SwiGLU MLP's ``fc1_g`` and ``fc1_x`` are its ``fc1``), so every family :func:`vitlab.load` builds (the
paper's, SwiGLU, q/v biases, RoPE, axial, hybrid) takes them alike. A wrapped layer is no longer the layer the speed
paths of :mod:`vitlab.accel` were built for: they stand aside for it (the plain forward runs), except the fused
training node, which takes a LoRA or SSF layer of a paper block by its effective ``weight`` and ``bias``
(:func:`vitlab.accel.blocks.adapted_block`).

- :func:`apply_tuning`: freeze the model, wrap (LoRA, SSF) or release (bias) what the method trains; the classifier
  head (``head``, ``head_dist``) always trains, as ``peft``'s ``modules_to_save`` does for a classifier;
- :func:`merge_adapters`: every wrapped layer replaced by the plain layer of its merged weights (in place);
  :func:`merged_copy`: the same on a copy, the trained model untouched; :func:`merged_state_dict`: the plain
  model's weights alone;
- :func:`trainable_counts`: the parameters that train, and all of them.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence

import torch
from torch import nn

from ..errors import ConfigError
from .lora import LoRALinear
from .ssf import SSF

__all__ = [
    "DEFAULT_RANK",
    "DEFAULT_TARGETS",
    "HEADS",
    "SSF",
    "TUNE_METHODS",
    "LoRALinear",
    "apply_tuning",
    "has_adapters",
    "merge_adapters",
    "merged_copy",
    "merged_state_dict",
    "target_linears",
    "trainable_counts",
]

TUNE_METHODS = ("full", "head", "lora", "ssf", "bias")
"""What fine-tuning trains: every weight, the head alone (a linear probe), low-rank updates of the block linears,
per-channel scales and shifts after them and after every LayerNorm, or every bias (each with the head)."""
DEFAULT_TARGETS = ("qkv", "proj", "fc1", "fc2")
"""The block linears LoRA and SSF adapt by default: all four of each encoder block (``peft`` users list the same
names for a timm ViT: ``target_modules=["qkv", "proj", "fc1", "fc2"]``)."""
DEFAULT_RANK = 8
"""LoRA's rank when none is given: ``peft``'s ``LoraConfig`` default ``r=8``."""
HEADS = ("head", "head_dist")
"""The classifier heads, which always train (new ones are zero-initialised)."""
_IN_BLOCK = re.compile(r"(?:^|\.)blocks\.\d+\.")
_SWIGLU_FC1 = (".fc1_g", ".fc1_x")


def _matches(name: str, target: str) -> bool:
    """``peft``'s rule (the module's name is the target or ends with ``.target``), and ``fc1`` also names a
    SwiGLU MLP's two input projections."""
    return name == target or name.endswith("." + target) or (target == "fc1" and name.endswith(_SWIGLU_FC1))


def target_linears(model: nn.Module, targets: Sequence[str] = DEFAULT_TARGETS) -> list[str]:
    """The names of the encoder blocks' linear layers that ``targets`` name (see :func:`_matches`), in the model's
    order; a :class:`~vitlab.errors.ConfigError` for a target that names none (a typo would otherwise train nothing
    it meant to)."""
    names = [n for n, m in model.named_modules() if type(m) is nn.Linear and _IN_BLOCK.search(n)]
    for t in targets:
        if not any(_matches(n, t) for n in names):
            roles = sorted({n.rsplit(".", 1)[-1] for n in names})
            raise ConfigError(f"{t!r} names no linear layer of the encoder blocks (theirs: {', '.join(roles)})")
    return [n for n in names if any(_matches(n, t) for t in targets)]


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def _release_heads(model: nn.Module) -> None:
    heads = [getattr(model, h, None) for h in HEADS]
    if not any(h is not None and any(True for _ in h.parameters()) for h in heads):
        raise ConfigError("trains the classifier head with its adapters, and this model has none")
    for h in heads:
        if h is not None:
            h.requires_grad_(True)


def apply_tuning(
    model: nn.Module, method: str, *, rank: int = DEFAULT_RANK, alpha: float | None = None,
    targets: Sequence[str] = DEFAULT_TARGETS,
) -> int:  # fmt: skip
    """Make ``model`` train by ``method`` (``lora``, ``ssf`` or ``bias``; ``full`` changes nothing), in place:
    every parameter frozen, then LoRA of ``rank`` and ``alpha`` (None: ``rank``, a scaling of 1, ``peft``'s default
    pair ``r=8, lora_alpha=8``) around the ``targets`` linears, or SSF around them and after every affine LayerNorm,
    or every bias released (``*.bias``, the attention's ``q_bias`` and ``v_bias``); the classifier heads always
    train. Returns the number of layers wrapped (bias: the bias tensors released). A ``ConfigError`` for an unknown
    method, a rank below 1, a target that names nothing, or a model without a head."""
    if method not in TUNE_METHODS:
        raise ConfigError(f"unknown tuning method {method!r}; choose {', '.join(TUNE_METHODS)}")
    if method == "full":
        return 0
    if method == "head":
        raise ConfigError("head-only tuning freezes the encoder (the linear probe's rule), it wraps nothing")
    if method == "lora" and rank < 1:
        raise ConfigError(f"a LoRA rank must be >= 1, got {rank}")
    names = target_linears(model, targets) if method in ("lora", "ssf") else []
    model.requires_grad_(False)
    if method == "lora":
        for n in names:
            _replace(model, n, LoRALinear(model.get_submodule(n), rank=rank, alpha=rank if alpha is None else alpha))
        done = len(names)
    elif method == "ssf":
        norms = [n for n, m in model.named_modules()
                 if type(m) is nn.LayerNorm and m.elementwise_affine and m.bias is not None]  # fmt: skip
        for n in names + norms:
            _replace(model, n, SSF(model.get_submodule(n)))
        done = len(names) + len(norms)
    else:
        biases = [p for n, p in model.named_parameters() if n.endswith((".bias", "_bias"))]
        for p in biases:
            p.requires_grad_(True)
        done = len(biases)
    _release_heads(model)
    return done


def has_adapters(model: nn.Module) -> bool:
    """Whether ``model`` holds a wrapped layer (LoRA, SSF)."""
    return any(isinstance(m, (LoRALinear, SSF)) for m in model.modules())


def merge_adapters(model: nn.Module) -> nn.Module:
    """Replace every wrapped layer of ``model`` by the plain layer of its merged weights, in place; returns
    ``model``, whose state dict then has the plain model's keys. A model without adapters is returned as it is."""
    wrapped = [n for n, m in model.named_modules() if isinstance(m, (LoRALinear, SSF))]
    for n in wrapped:
        _replace(model, n, model.get_submodule(n).merged())
    return model


def merged_copy(model: nn.Module) -> nn.Module:
    """``model`` with its adapters merged, as a copy (the trained model keeps training); ``model`` itself when it
    holds none."""
    return merge_adapters(copy.deepcopy(model)) if has_adapters(model) else model


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of ``model`` with its adapters merged (the plain model's keys), without copying the model: each
    wrapped layer's entries replaced by those of its merged layer; ``model.state_dict()`` when it holds none."""
    wrapped = {f"{n}.": m for n, m in model.named_modules() if isinstance(m, (LoRALinear, SSF))}
    if not wrapped:
        return model.state_dict()
    state = {k: v for k, v in model.state_dict().items() if not any(k.startswith(p) for p in wrapped)}
    for prefix, m in wrapped.items():
        state.update({prefix + k: v for k, v in m.merged().state_dict().items()})
    return state


def trainable_counts(model: nn.Module) -> tuple[int, int]:
    """``(parameters that train, all parameters)`` of ``model``, adapters included (``peft``'s
    ``print_trainable_parameters``)."""
    total = trainable = 0
    for p in model.parameters():
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total

"""Reading and writing weights: vitlab's folder format and the world's formats.

One small module per format: :mod:`.native` (vitlab folders), :mod:`.timm`,
:mod:`.hf` (Hugging Face), :mod:`.npz` (Google's vit_jax and big_vision), and
:mod:`.hub` (public names). :func:`load` detects the format, converts names to
timm's, infers the architecture from the tensor shapes (:mod:`.infer`), applies
overrides, and loads with a full report of missing, unexpected and mis-shaped keys.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError
from ..models.config import ViTConfig
from ..models.vit import VisionTransformer
from .native import is_native, load_folder, save

__all__ = ["Checkpoint", "load", "load_state", "read_checkpoint", "save"]


@dataclass
class Checkpoint:
    """A checkpoint read from disk: tensors in vitlab names and what is known of the architecture."""

    state: dict[str, torch.Tensor]
    fields: dict[str, Any]
    """ViTConfig fields the format states (HF config, npz head count ...); shapes fill in the rest."""
    format: str
    config: ViTConfig | None = None
    """The full configuration, for formats that store one (vitlab folders)."""
    extra: dict[str, Any] = field(default_factory=dict)


def read_checkpoint(source: str | os.PathLike[str] | Mapping[str, torch.Tensor]) -> Checkpoint:
    """Read any supported checkpoint (path, public name, or an in-memory state dict)."""
    from . import hf, hub, npz, timm
    from .files import read_state_dict, unwrap_state_dict

    if isinstance(source, Mapping):
        return _from_state_dict(unwrap_state_dict(source, source="state dict"), "state dict", {})
    p = Path(source)
    if not p.exists():
        if hub.is_hub_name(str(source)):
            return read_checkpoint(hub.resolve(str(source)))
        hub.resolve(str(source))  # raises: unknown name, with suggestions
    if p.is_dir():
        if is_native(p):
            cfg, state, _ = load_folder(p)
            return Checkpoint(state, {}, "vitlab", config=cfg)
        if hf.is_hf_folder(p):
            state, fields = hf.read_folder(p)
            return Checkpoint(state, fields, "huggingface")
        for name in ("model.safetensors", "pytorch_model.bin"):  # e.g. a timm Hub snapshot folder
            if (p / name).is_file():
                return read_checkpoint(p / name)
        raise CheckpointError(
            f"{p}: a folder that is neither a vitlab model (model.safetensors + config.json) "
            "nor a Hugging Face save_pretrained folder"
        )
    if p.suffix.lower() == ".npz":
        state, fields = npz.read_checkpoint(p)
        return Checkpoint(state, fields, "npz")
    state = read_state_dict(p)
    return _from_state_dict(state, str(p), timm.read_hub_config(p))


def _from_state_dict(state: dict[str, torch.Tensor], source: str, fields: dict[str, Any]) -> Checkpoint:
    from . import hf, timm

    if hf.is_hf_state(state):
        return Checkpoint(hf.convert_state(state), {"norm_eps": 1e-12, **fields}, "huggingface")
    if timm.is_timm_state(state):
        return Checkpoint(timm.convert_state(state), fields, "timm")
    names = ", ".join(list(state)[:5])
    raise CheckpointError(
        f"{source}: not a ViT checkpoint: no patch embedding ('patch_embed.proj.weight' as in timm, or "
        f"'embeddings.patch_embeddings.projection.weight' as in Hugging Face); "
        f"its {len(state)} tensors start with {names}"
    )


def _config_for(ckpt: Checkpoint, overrides: dict[str, Any]) -> ViTConfig:
    from .infer import guess_num_heads, infer_fields

    if ckpt.config is not None:
        base = ckpt.config.to_dict()
    else:
        base = {**infer_fields(ckpt.state), **ckpt.fields}
        base.setdefault("posemb_resample", "bicubic")
        if "num_heads" not in base and "num_heads" not in overrides:
            base["num_heads"] = guess_num_heads(int(base["embed_dim"]))
        base["extra"] = {"source_format": ckpt.format, **base.get("extra", {})}
    names = base.get("class_names")
    if names is not None and (
        len(names) != overrides.get("num_classes", base.get("num_classes")) or "class_names" in overrides
    ):
        base["class_names"] = None  # a new head (or new names): the old names no longer apply
    unknown = set(overrides) - {f.name for f in dataclasses.fields(ViTConfig)}
    if unknown:
        raise ConfigError(f"unknown ViTConfig option(s): {', '.join(sorted(unknown))}")
    return ViTConfig.from_dict({**base, **overrides})


def _summary(keys: list[str], limit: int = 8, *, group: bool = True) -> str:
    """Key names, a whole layer's keys collapsed to ``blocks.N.*``, at most ``limit`` items."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        m = re.match(r"(blocks\.\d+)\.", k) if group else None
        groups.setdefault(f"{m.group(1)}.*" if m else k, []).append(k)
    items = [g if len(v) > 1 else v[0] for g, v in groups.items()]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    count = f" ({len(keys)} tensors)" if len(keys) > len(items) else ""
    return ", ".join(items[:limit]) + more + count


def load_state(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    *,
    strict: bool = True,
    source: str = "checkpoint",
    fresh: tuple[str, ...] = (),
) -> None:
    """Load ``state`` into ``model``, resampling learned position embeddings to the model's grid.

    Missing, unexpected and mis-shaped keys are all named; with ``strict`` any of them raises a
    :class:`CheckpointError` and nothing is loaded, otherwise a warning lists them and the rest loads.
    Parameters whose names start with one of ``fresh`` keep their initial values and are not missing.
    """
    state = dict(state)
    expected = model.state_dict()
    adapt = getattr(model, "adapt_state_dict", None)
    if adapt is not None:  # position embeddings of another grid: resampled, not reported as mis-shaped
        state = adapt(state)
    missing = [k for k in expected if k not in state and not (fresh and k.startswith(fresh))]
    unexpected = [k for k in state if k not in expected]
    misshaped = [k for k in state if k in expected and state[k].shape != expected[k].shape]
    problems = []
    if missing:
        problems.append(f"missing {_summary(missing)}")
    if unexpected:
        problems.append(f"unexpected {_summary(unexpected)}")
    if misshaped:
        problems.append(
            "mis-shaped "
            + _summary(
                [f"{k} {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}" for k in misshaped], 4, group=False
            )
        )
    if problems:
        msg = f"{source} does not fit the model: " + "; ".join(problems)
        if strict:
            raise CheckpointError(msg + " (check the architecture overrides, or pass strict=False to load the rest)")
        warnings.warn(msg + "; loading the rest (strict=False)", stacklevel=3)
        for k in misshaped:
            del state[k]
    model.load_state_dict(state, strict=False)


def load(
    source: str | os.PathLike[str] | Mapping[str, torch.Tensor], *, strict: bool = True, **overrides: Any
) -> VisionTransformer:
    """Load a ViT from any supported checkpoint, ready for inference (``eval()`` mode).

    ``source`` is a vitlab folder, a Hugging Face ``save_pretrained`` folder, a timm
    state dict file (``.pth``/``.bin``/``.safetensors``), a Google ``.npz`` (vit_jax or
    big_vision), a public name such as ``"augreg_in21k_ft_in1k/vit_b16"`` (see
    :mod:`vitlab.checkpoints.hub`), or an in-memory state dict.

    ``overrides`` change the configuration (``img_size=384``, ``act="gelu"``,
    ``num_heads=6`` ...). Learned position embeddings are resampled to a new
    ``img_size`` (``"jax"`` mode for npz as in the official code, bicubic for timm
    and HF). A different ``num_classes`` replaces the classifier by a fresh
    zero-initialised one, for fine-tuning; that is not a load error.

    Raises :class:`CheckpointError` naming missing, unexpected and mis-shaped keys
    unless ``strict=False`` (then it warns and loads what fits).
    """
    ckpt = read_checkpoint(source)
    cfg = _config_for(ckpt, overrides)
    state = dict(ckpt.state)
    old_classes = int(state["head.weight"].shape[0]) if "head.weight" in state else 0
    # head="linear" on a checkpoint with pre-logits drops them (as timm does for fine-tuning), and the classifier
    # with them.
    drop_pre_logits = "head" in overrides and cfg.head != "mlp" and "pre_logits.fc.weight" in state
    if drop_pre_logits:
        state = {k: v for k, v in state.items() if not k.startswith("pre_logits.")}
    fresh: tuple[str, ...] = ()
    if drop_pre_logits or cfg.num_classes != old_classes:
        state = {k: v for k, v in state.items() if not k.startswith("head.")}
        fresh = ("head.",)
    model = VisionTransformer(cfg)  # its head is zero-initialised
    src = str(source) if not isinstance(source, Mapping) else "state dict"
    load_state(model, state, strict=strict, source=src, fresh=fresh)
    return model.eval()

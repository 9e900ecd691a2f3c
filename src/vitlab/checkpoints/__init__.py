"""Reading and writing weights: vitlab's folder format and the world's formats.

One small module per format: :mod:`.vitlab_folder` (vitlab folders), :mod:`.timm`,
:mod:`.hf` (Hugging Face), :mod:`.npz` (Google's vit_jax and big_vision), :mod:`.dinov3`
(Meta's DINOv3 release and Hugging Face's port), and :mod:`.hub` (public names); :mod:`.families`
tells the backbones of timm's ``Eva`` class apart by their keys, and :mod:`.layouts` writes a model in
timm's, Hugging Face's or Meta's layout. :func:`load` detects the format, converts names to
timm's, infers the architecture from the tensor shapes (:mod:`.infer`) and the family, applies
overrides, and loads with a full report of missing, unexpected and mis-shaped keys.

Checkpoints are untrusted input. Archives are inflated only within a bound
(:func:`.files.unpacked_limit`), config files are read only when regular and small
(:func:`.files.read_config_file`), every config value is type- and range-checked, and the
model a config describes is checked before any of it is allocated: its parameter count
against :data:`MAX_PARAMS`, the widths and depth it states against the weights' shapes, and
then every tensor shape against a model built on the ``meta`` device (no memory). A lying
config costs no memory: it is one line naming the file and the field.
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
from ..models.config import ViTConfig, check_fields
from ..models.flexi import resample_patch_embed
from ..models.vit import VisionTransformer
from .families import backbone_name
from .vitlab_folder import is_native, load_folder, save

__all__ = [
    "MAX_PARAMS",
    "MAX_PARAMS_ENV",
    "Checkpoint",
    "checkpoint_config",
    "load",
    "load_state",
    "read_checkpoint",
    "save",
]

MAX_PARAMS = 4_000_000_000
"""Largest model :func:`load` builds (16 GB of float32; ViT-H/14 has 632M, ViT-G/14 1.8B)."""
MAX_PARAMS_ENV = "VITLAB_MAX_PARAMS"
"""Environment variable that replaces :data:`MAX_PARAMS` (``max_params=`` takes precedence)."""
# Fields the weights' shapes determine: a config (file) that states another value lies.
_SHAPE_FIELDS = ("depth", "embed_dim", "mlp_dim", "patch_size", "img_size")
_STRICT_HINT = " (check the architecture overrides, or pass strict=False to load the rest)"


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
    """Metadata for the model config's ``extra`` (a public name's ``hf_hub_id`` and ``license``)."""
    config_file: str | None = None
    """The config file that stated ``fields`` or ``config`` (named in errors about them)."""
    config_names: dict[str, str] = field(default_factory=dict)
    """ViTConfig field -> the name the config file uses for it (Hugging Face's ``num_hidden_layers`` ...)."""

    def blame(self, option: str) -> str:
        """``path: name`` of the config file's field behind the ViTConfig field ``option``."""
        return f"{self.config_file}: {self.config_names.get(option, option)}"


def read_checkpoint(
    source: str | os.PathLike[str] | Mapping[str, torch.Tensor], *, max_unpacked_bytes: int | None = None
) -> Checkpoint:
    """Read any supported checkpoint (path, public name, or an in-memory state dict).

    ``max_unpacked_bytes`` bounds what compressed archives (``.npz``, PyTorch zip files) may
    unpack to (default: :func:`.files.unpacked_limit`)."""
    from . import hf, hub, npz, timm
    from .files import read_state_dict, unwrap_state_dict

    if isinstance(source, Mapping):
        return _from_state_dict(unwrap_state_dict(source, source="state dict"), "state dict", {})
    p = Path(source)
    if not p.exists():
        if hub.is_hub_name(str(source)):
            ckpt = read_checkpoint(hub.resolve(str(source)), max_unpacked_bytes=max_unpacked_bytes)
            fields, meta = hub.card(str(source))
            ckpt.fields = {**fields, **ckpt.fields}  # what the downloaded config.json states wins
            ckpt.extra.update(meta)
            return ckpt
        hub.resolve(str(source))  # raises: unknown name, with suggestions
    if p.is_dir():
        if is_native(p):
            cfg, state, _ = load_folder(p)
            return Checkpoint(state, {}, "vitlab", config=cfg, config_file=str(p / "config.json"))
        if is_native(p / "model"):  # a run folder (`vitlab train --out`): the model it wrote
            return read_checkpoint(p / "model", max_unpacked_bytes=max_unpacked_bytes)
        if hf.is_hf_folder(p):
            state, fields = hf.read_folder(p, max_unpacked_bytes=max_unpacked_bytes)
            names = {ours: theirs for ours, theirs in hf.FIELD_NAMES if ours in fields}
            return Checkpoint(state, fields, "huggingface", config_file=str(p / "config.json"), config_names=names)
        for name in ("model.safetensors", "pytorch_model.bin"):  # e.g. a timm Hub snapshot folder
            if (p / name).is_file():
                return read_checkpoint(p / name, max_unpacked_bytes=max_unpacked_bytes)
        raise CheckpointError(
            f"{p}: a folder that is neither a vitlab model (model.safetensors + config.json) "
            "nor a Hugging Face save_pretrained folder"
        )
    if p.suffix.lower() == ".npz":
        state, fields, cfg = npz.read_checkpoint(p, max_unpacked_bytes=max_unpacked_bytes)
        if cfg is not None:  # written by vitlab: its whole config, checked against the weights as config.json is
            return Checkpoint(state, {}, "npz", config=cfg, config_file=f"{p} ({npz.CONFIG_KEY})")
        return Checkpoint(state, fields, "npz")
    if p.suffix.lower() in _TEXT_SUFFIXES:  # a model folder's config.json or a run's config.yaml, named for its folder
        home = p.parent
        if is_native(home) or is_native(home / "model") or hf.is_hf_folder(home):
            raise CheckpointError(f"{p}: a {p.suffix} file beside the model, not its weights; give the folder: {home}")
        raise CheckpointError(
            f"{p}: a {p.suffix} file, not a checkpoint (weights: .safetensors, .pth, .pt, .bin, .npz)"
        )
    state = read_state_dict(p, max_unpacked_bytes=max_unpacked_bytes)
    hub_config = p.parent / "config.json"
    proj = state.get("patch_embed.proj.weight")
    fields = timm.read_hub_config(p, width=int(proj.shape[0]) if proj is not None and proj.ndim == 4 else None)
    return _from_state_dict(state, str(p), fields, config_file=str(hub_config) if fields else None)


_TEXT_SUFFIXES = (".json", ".yaml", ".yml", ".txt", ".md", ".jsonl", ".csv")
"""Files a user may give as a model by mistake (the config beside the weights, a run's notes): text, never weights."""


def _from_state_dict(
    state: dict[str, torch.Tensor], source: str, fields: dict[str, Any], *, config_file: str | None = None
) -> Checkpoint:
    from . import dinov3, families, hf, timm

    if dinov3.is_meta_state(state):  # Meta's DINOv3 release (its keys are timm-like: told apart first)
        meta_state, implied = dinov3.from_meta(state, source=source)
        return Checkpoint(
            meta_state, {**implied, **fields}, "meta", config_file=config_file, extra={"family": "DINOv3"}
        )
    if hf.is_hf_state(state):
        return Checkpoint(
            hf.convert_state(state), {"norm_eps": 1e-12, **fields}, "huggingface", config_file=config_file
        )
    naflex = families.is_naflex_state(state)
    if naflex:  # SigLIP 2's NaFlex towers: timm's VisionTransformer names, then as any timm state
        state = families.from_naflex(state, source=source)
    if timm.is_timm_state(state):
        family = families.identify(state, source=source, stated=fields)
        layout = families.timm_layout(state)
        if naflex:
            family = families.Family("SigLIP 2 NaFlex", {**(family.fields if family else {}), **families.NAFLEX})
            layout = ",".join(filter(None, (layout, "naflex")))
        fields = {**(family.fields if family else {}), **fields}  # (what a Hub config.json names wins)
        extra = {"family": family.name} if family else {}
        if layout:
            extra["timm_layout"] = layout
        return Checkpoint(
            timm.convert_state(state, source=source), fields, "timm", config_file=config_file, extra=extra
        )
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
        given = overrides.get("img_size", ckpt.fields.get("img_size"))  # (a rectangular table: its grid stated)
        given = None if given is None else check_fields({"img_size": given})["img_size"]
        base = {**infer_fields(ckpt.state, img_size=given), **ckpt.fields}
        base.setdefault("posemb_resample", "bicubic")
        if "num_heads" not in base and "num_heads" not in overrides:
            base["num_heads"] = guess_num_heads(int(base["embed_dim"]))
        base["extra"] = {"source_format": ckpt.format, **base.get("extra", {})}
    if ckpt.extra:  # what is known of where the checkpoint came from (a public name's Hub repo and licence)
        base["extra"] = {**(base.get("extra") or {}), **ckpt.extra}
    names = base.get("class_names")
    if names is not None and (
        len(names) != overrides.get("num_classes", base.get("num_classes")) or "class_names" in overrides
    ):
        base["class_names"] = None  # a new head (or new names): the old names no longer apply
    unknown = set(overrides) - {f.name for f in dataclasses.fields(ViTConfig)}
    if unknown:
        raise ConfigError(f"unknown ViTConfig option(s): {', '.join(sorted(unknown))}")
    try:
        cfg = ViTConfig.from_dict({**base, **overrides})
    except ConfigError as e:  # a value of the file's config (not one the caller gave): name the file
        option = str(e).split(":", 1)[0].split("[", 1)[0]
        if ckpt.config_file is None or option in overrides:
            raise
        raise CheckpointError(f"{ckpt.blame(option)}{str(e)[len(option) :]}") from None
    family = (base.get("extra") or {}).get("family")
    if ckpt.config is None and family and "name" not in overrides:  # timm's name when it is one, else the family's
        slug = re.sub(r"[^a-z0-9]+", "_", family.lower()).strip("_")
        cfg = cfg.replace(name=backbone_name(cfg) or f"{slug}_custom")
    if "img_size" in overrides:  # built at a side it was given: an image processor's other side no longer applies
        cfg = cfg.at_size(cfg.img_size)
    return cfg


def checkpoint_config(ckpt: Checkpoint, **overrides: Any) -> ViTConfig:
    """The configuration :func:`load` gives the model of the read checkpoint ``ckpt`` with ``overrides``: nothing
    is allocated (a training run estimates its memory from it before building the model)."""
    return _config_for(ckpt, overrides)


def _max_params(max_params: int | None) -> int:
    if max_params is not None:
        return int(max_params)
    env = os.environ.get(MAX_PARAMS_ENV)
    if not env:
        return MAX_PARAMS
    try:
        return int(float(env))
    except ValueError:
        raise ConfigError(f"{MAX_PARAMS_ENV}: {env!r} is not a number of parameters (e.g. 8e9)") from None


def _check_before_building(ckpt: Checkpoint, cfg: ViTConfig, overrides: dict[str, Any], *, max_params: int) -> None:
    """Refuse, before any memory is allocated, a model too large to build or whose widths and depth
    (as a config file states them) disagree with the weights' shapes."""
    from .infer import infer_fields

    n = cfg.num_params()
    if cfg.posemb == "sincos2d":  # a buffer, not a parameter, but as large as a learned table
        n += (cfg.num_patches + cfg.num_prefix_tokens) * cfg.embed_dim
    if n > max_params:
        where = f"{ckpt.config_file}: " if ckpt.config_file else ""
        values = {
            "depth": cfg.depth,
            "embed_dim": cfg.embed_dim,
            "mlp_dim": cfg.mlp_dim,
            "num_classes": cfg.num_classes,
        }
        values["img_size"] = f"{cfg.img_size[0]}x{cfg.img_size[1]}"
        stated = ", ".join(f"{ckpt.config_names.get(o, o)} {v}" for o, v in values.items())
        raise CheckpointError(
            f"{where}the config describes a model of {n:,} parameters ({stated}), over the cap of {max_params:,}; "
            f"if you trust it, pass max_params=... or set {MAX_PARAMS_ENV}"
        )
    if ckpt.config_file is None:
        return
    try:
        shapes = infer_fields(ckpt.state, img_size=cfg.img_size)
    except CheckpointError:  # not the usual layout: the meta-device check below names the tensors
        return
    for option in _SHAPE_FIELDS:
        if option in overrides or option not in shapes:
            continue  # (no learned position embeddings: the image size is free)
        if option == "mlp_dim" and "blocks.0.mlp.fc1.weight" not in ckpt.state:
            continue  # (axial blocks keep their MLPs under blocks.N.row / .col: the meta check covers them)
        if getattr(cfg, option) != shapes[option]:
            what = {
                "depth": "transformer layers",
                "embed_dim": "as width",
                "mlp_dim": "as MLP width",
                "img_size": "as position embeddings",
            }
            raise CheckpointError(
                f"{ckpt.blame(option)} is {getattr(cfg, option)} but the weights have {shapes[option]}"
                f"{' ' + what[option] if option in what else ''}; the config does not describe these weights"
            )


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
    state, problems, misshaped = _adapt_state(model, state, fresh)
    if problems:
        msg = f"{source} does not fit the model: " + "; ".join(problems)
        if strict:
            raise CheckpointError(msg + _STRICT_HINT)
        warnings.warn(msg + "; loading the rest (strict=False)", stacklevel=3)
        for k in misshaped:
            del state[k]
    model.load_state_dict(state, strict=False)


def _adapt_state(
    model: nn.Module, state: dict[str, torch.Tensor], fresh: tuple[str, ...]
) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """``(state adapted to the model, problems, mis-shaped keys)``; reads only shapes of the model, so a
    model on the ``meta`` device answers without allocating."""
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
    return state, problems, misshaped


def load(
    source: str | os.PathLike[str] | Mapping[str, torch.Tensor] | Checkpoint,
    *,
    strict: bool = True,
    max_params: int | None = None,
    max_unpacked_bytes: int | None = None,
    **overrides: Any,
) -> VisionTransformer:
    """Load a ViT from any supported checkpoint, ready for inference (``eval()`` mode).

    ``source`` is a vitlab folder, a run folder (``vitlab train --out``: its ``model/``), a Hugging
    Face ``save_pretrained`` folder, a timm state dict file (``.pth``/``.bin``/``.safetensors``), a
    Google ``.npz`` (vit_jax or big_vision), a public name such as ``"augreg_in21k_ft_in1k/vit_b16"`` (see
    :mod:`vitlab.checkpoints.hub`), an in-memory state dict, or a :class:`Checkpoint` already read
    (:func:`read_checkpoint`: a file read once serves :func:`checkpoint_config` and the model).

    ``overrides`` change the configuration (``img_size=384``, ``act="gelu"``,
    ``num_heads=6`` ...). Another ``patch_size`` resizes the patch projection as FlexiViT does
    (:func:`vitlab.models.resample_patch_embed`) and the position embeddings to the new grid.
    Learned position embeddings are resampled to a new ``img_size`` (``"jax"`` mode for npz as
    in the official code, bicubic for timm and HF). A different ``num_classes`` replaces the classifier by a fresh
    zero-initialised one, for fine-tuning; that is not a load error.

    Raises :class:`CheckpointError` naming missing, unexpected and mis-shaped keys
    unless ``strict=False`` (then it warns and loads what fits).

    Nothing is allocated for the model until its config has passed: at most ``max_params``
    parameters (default :data:`MAX_PARAMS`, or ``$VITLAB_MAX_PARAMS``), the depth and widths a
    config file states equal to the weights', and (with ``strict``) every tensor shape equal to
    those of the model built on the ``meta`` device. ``max_unpacked_bytes`` bounds what
    compressed archives may unpack to (:func:`.files.unpacked_limit`; ``$VITLAB_MAX_UNPACKED_BYTES``).
    """
    ckpt = source if isinstance(source, Checkpoint) else read_checkpoint(source, max_unpacked_bytes=max_unpacked_bytes)
    cfg = _config_for(ckpt, overrides)
    _check_before_building(ckpt, cfg, overrides, max_params=_max_params(max_params))
    state = dict(ckpt.state)
    proj = state.get("patch_embed.proj.weight")
    if "patch_size" in overrides and proj is not None and proj.ndim == 4 and proj.shape[-1] != cfg.patch_size:
        state["patch_embed.proj.weight"] = resample_patch_embed(proj, cfg.patch_size)  # FlexiViT's PI-resize
    old_classes = int(state["head.weight"].shape[0]) if "head.weight" in state else 0
    # head="linear" on a checkpoint with pre-logits drops them (as timm does for fine-tuning), and the classifier
    # with them.
    drop_pre_logits = "head" in overrides and cfg.head != "mlp" and "pre_logits.fc.weight" in state
    if drop_pre_logits:
        state = {k: v for k, v in state.items() if not k.startswith("pre_logits.")}
    fresh: tuple[str, ...] = ()
    if drop_pre_logits or cfg.num_classes != old_classes:
        fresh = ("head.", "head_dist.")  # (DeiT's distillation head is a classifier too)
        state = {k: v for k, v in state.items() if not k.startswith(fresh)}
    src = (
        "state dict" if isinstance(source, Mapping) else "checkpoint" if isinstance(source, Checkpoint) else str(source)
    )
    if strict:  # every shape checked on a model that holds no memory, before the real one is built
        with torch.device("meta"):
            problems = _adapt_state(VisionTransformer(cfg), state, fresh)[1]
        if problems:
            raise CheckpointError(f"{src} does not fit the model: {'; '.join(problems)}{_STRICT_HINT}")
    model = VisionTransformer(cfg)  # its head is zero-initialised
    load_state(model, state, strict=strict, source=src, fresh=fresh)
    return model.eval()

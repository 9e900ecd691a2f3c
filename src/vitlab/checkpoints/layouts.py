"""Writing a model in another library's layout (``vitlab convert SRC DST --layout timm|hf|meta``), so that the other
library loads it strictly (timm's ``load_state_dict(strict=True)``, Hugging Face's ``from_pretrained``, Meta's
``DinoVisionTransformer``) and computes what vitlab computes.

========  ========================================================  =================================================
layout    what is written                                           families
========  ========================================================  =================================================
``timm``  ``DST/model.safetensors`` + ``DST/config.json`` (timm's    every family timm has: its ``VisionTransformer``
          Hub format: ``architecture``, ``model_args``,             names, and its ``Eva`` names for EVA-02, DINOv3,
          ``pretrained_cfg``; ``timm.create_model("local-dir:DST",   the Perception Encoder and the RoPE ViTs
          pretrained=True)``), or the weights alone when ``DST``
          ends in ``.safetensors``/``.pth``/``.bin``
``hf``    ``DST/config.json`` + ``model.safetensors`` +              DINOv3 (``DINOv3ViTModel``), the paper's ViT
          ``preprocessor_config.json`` (``save_pretrained``'s)       (``ViTModel``, ``ViTForImageClassification``)
``meta``  Meta's state dict: ``DST`` (``.pth``/``.safetensors``) or  DINOv3 (``DinoVisionTransformer``; its keyword
          ``DST/model.safetensors``, with ``DST/dinov3_kwargs.json``  arguments in ``dinov3_kwargs.json``)
========  ========================================================  =================================================

What a layout cannot hold is refused by name before anything is written (e.g. a classifier in Hugging Face's
``DINOv3ViTModel``, vitlab's own ``axial`` RoPE in timm). Files are written beside their final names and renamed
into place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._fs import default_file_mode, refuse_blocked, remove_stale, temp_path
from ..errors import CheckpointError, ConfigError
from ..evaluate.calibration import model_temperature
from ..models.config import ViTConfig
from ..models.timm_api import TIMM_POOL, pretrained_cfg
from ..models.variants import BACKBONES, NO_EMBED_CLASS, NOT_IN_TIMM, TIMM_ALIASES, model_config
from . import dinov3, families, hf

__all__ = ["LAYOUTS", "layout_files", "write_layout"]

LAYOUTS = ("timm", "hf", "meta")
_WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


def layout_files(dst: str | os.PathLike[str], layout: str) -> list[Path]:
    """The files :func:`write_layout` writes for ``dst`` in ``layout``."""
    out = Path(dst)
    if layout in ("timm", "meta") and out.suffix.lower() in _WEIGHT_SUFFIXES:
        return [out]
    if layout == "timm":
        return [out / "model.safetensors", out / "config.json"]
    if layout == "hf":
        return [out / "model.safetensors", out / "config.json", out / "preprocessor_config.json"]
    return [out / "model.safetensors", out / "dinov3_kwargs.json"]


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}


_LEARNED_ONLY = {"timm": ("sincos2d", "learn2d"), "hf": ("sincos2d", "learn2d", "none")}
"""The position embeddings a layout's classes have no place for, by layout: timm's ``VisionTransformer`` and ``Eva``
learn one table or have none, Hugging Face's ``ViTModel`` always learns one."""


def _portable(model: nn.Module, layout: str) -> tuple[ViTConfig, dict[str, torch.Tensor], list[str]]:
    """``(config, state dict, notes)`` of ``model`` as ``layout`` can hold it: position embeddings the layout has no
    place for (:data:`_LEARNED_ONLY`: the fixed sine-cosine table every auto recipe picks, Appendix D.4's row and
    column tables, none at all) are written as the one learned table E_pos (Eq. 1) they equal at the model's
    resolution, zero for the class and register tokens, which these variants leave without one. At that resolution
    the other library computes what vitlab computes; at another one it resamples the table as a learned one (Sec.
    3.2), where vitlab recomputes the sine-cosine table or resamples rows and columns apart, so the two differ."""
    cfg: ViTConfig = model.config  # type: ignore[assignment]
    state = _state(model)
    if cfg.posemb not in _LEARNED_ONLY.get(layout, ()) or (cfg.rope and cfg.rope_kind == "dinov3"):
        return cfg, state, []
    with torch.no_grad():
        patches = model.patch_posemb(cfg.grid_size)  # type: ignore[operator]
    n, d = cfg.num_patches, cfg.embed_dim
    patches = torch.zeros(1, n, d) if patches is None else patches.detach().float().cpu()
    table = torch.cat([torch.zeros(1, cfg.num_prefix_tokens, d), patches], dim=1)
    state = {k: v for k, v in state.items() if k not in ("pos_embed_row", "pos_embed_col")}
    state["pos_embed"] = table.to(next(iter(state.values())).dtype).contiguous()
    h, w = cfg.img_size
    note = (
        f"posemb {cfg.posemb!r}: written as the learned table it equals at {h}x{w} px (the same outputs there; at "
        f"another size {'timm' if layout == 'timm' else 'Hugging Face'} resamples it as a learned table, vitlab "
        f"{'recomputes it' if cfg.posemb == 'sincos2d' else 'does not'})"
    )
    return cfg.replace(posemb="learn"), state, [note]


def _refuse(cfg: ViTConfig, layout: str, options: list[str], where: str) -> CheckpointError:
    what = ", ".join(f"{o} {getattr(cfg, o)!r}" for o in options)
    return CheckpointError(f"{what}: has no place in {where}; the model cannot be written in the {layout} layout")


# -- timm -------------------------------------------------------------------------------------------------------------
def _eva_class(cfg: ViTConfig) -> bool:
    """Whether timm keeps this architecture in its ``Eva`` class (RoPE, q/v biases, NormFormer norms, pooling of every
    token) rather than its ``VisionTransformer``."""
    return bool(
        cfg.rope
        or (cfg.qkv_bias and not cfg.key_bias)
        or cfg.attn_norm
        or cfg.mlp_norm
        or (cfg.pool == "map" and cfg.pool_include_prefix)
    )


def _timm_weights(cfg: ViTConfig, state: dict[str, torch.Tensor], *, target: str | None) -> dict[str, torch.Tensor]:
    """The state dict (vitlab's names) of a model of ``cfg`` in timm's names for the timm class that has its
    architecture (``target``: the timm name it is written as, when one is)."""
    if cfg.pool == "seq":  # CCT's sequence pooling: no timm class pools so
        raise _refuse(cfg, "timm", ["pool"], "timm's VisionTransformer or Eva (their pooling: token, avg, map)")
    layout = set(str(cfg.extra.get("timm_layout", "")).split(",")) - {""}
    if target in NO_EMBED_CLASS:
        layout.add("no_embed_class")
    if cfg.rope and cfg.rope_kind == "axial":
        raise CheckpointError(
            "rope_kind 'axial': vitlab's own 2-D RoPE convention has no timm model (timm's are eva, pe and dinov3); "
            "the model cannot be written in the timm layout"
        )
    if "no_embed_class" in layout and "pos_embed" in state:  # (DINOv2 with registers, Naver's "_ape"): the table
        prefix = state["pos_embed"][:, : cfg.num_prefix_tokens]  # has no rows for the prefix tokens, whose rows are
        at = 0  # constants added to constant tokens: they are added to the tokens themselves, the same inputs
        for name in ("cls_token", "dist_token", "reg_token"):  # (vitlab's order of the prefix)
            if name in state:
                n = state[name].shape[1]
                state[name] = state[name] + prefix[:, at : at + n]
                at += n
        state["pos_embed"] = state["pos_embed"][:, cfg.num_prefix_tokens :]
    if not _eva_class(cfg):
        if cfg.mlp == "swiglu":  # timm's VisionTransformer with SwiGLUPacked (DINOv2 giant)
            state = families.to_eva(state, split_qkv=False, packed_glu=True, eva=False)
        if "naflex" in layout:  # timm's NaFlexVit (SigLIP 2 NaFlex)
            state = families.to_naflex(state, cfg.grid_size)
        return state
    bad = [
        o
        for o, v in (
            ("dist_token", cfg.dist_token),
            ("head", cfg.head != "linear"),
            ("posemb", cfg.posemb not in ("learn", "none")),
            ("pool", (cfg.pool == "map") != cfg.pool_include_prefix),
            ("pool_include_prefix", cfg.pool == "gap" and cfg.pool_include_prefix),
            ("attention", cfg.attention != "global"),
            ("hybrid_layers", cfg.hybrid_layers is not None or cfg.stem != "patch"),
            ("dynamic_img_pad", cfg.dynamic_img_pad and _padded(cfg) != cfg.img_size),
        )
        if v
    ]
    if bad:
        raise _refuse(cfg, "timm", bad, "timm's Eva class (RoPE ViTs)")
    for i in range(cfg.depth if cfg.rope_kind != "pe" else 0):
        # timm's EvaAttention (EVA, DINOv3) has no bias on the keys: only a zero one converts (its AttentionRope,
        # the Perception Encoder's and Naver's, has the whole qkv bias)
        bias = state.pop(f"blocks.{i}.attn.qkv.bias", None)
        if bias is not None:
            q, k, v = bias.chunk(3)
            if torch.count_nonzero(k):
                raise CheckpointError(
                    f"blocks.{i}.attn.qkv.bias: the keys have a bias, which timm's Eva class (EVA, DINOv3) does not "
                    "have; the model cannot be written in the timm layout"
                )
            state[f"blocks.{i}.attn.q_bias"], state[f"blocks.{i}.attn.v_bias"] = q, v
    if layout & {"split_qkv", "packed_glu"} or cfg.extra.get("timm_layout") is not None:
        split, packed = "split_qkv" in layout, "packed_glu" in layout
    else:  # timm's defaults: EVA-02 B/L keep q, k, v apart and SwiGLU split; T/S fuse q, k, v and pack SwiGLU
        eva02 = cfg.rope_kind == "eva" and cfg.posemb == "learn"
        split, packed = eva02 and cfg.mlp_norm, eva02 and cfg.mlp == "swiglu" and not cfg.mlp_norm
    return families.to_eva(state, split_qkv=split, packed_glu=packed and cfg.mlp == "swiglu")


def _timm_architecture(cfg: ViTConfig) -> tuple[str, dict[str, Any]] | None:
    """``(timm architecture name, model_args)`` that ``timm.create_model`` builds ``cfg`` from, or None when no
    timm name has its options."""
    base = cfg.name.split(".", 1)[0]
    timm_names = [n for n in (*BACKBONES, *TIMM_ALIASES) if n not in NOT_IN_TIMM]
    if base not in timm_names:  # the nearest of timm's names with the same options
        refs = {n: c for n in timm_names if (c := _timm_name_config(n)) is not None}
        regs = cfg.reg_tokens > 0  # a name with registers (or without) as the model has them first: its table's rows
        hits = [
            ((c.reg_tokens > 0) != regs, _distance(c, cfg), not n.startswith("vit_"), n)
            for n, c in refs.items()
            if _same(c, cfg)
        ]
        base = min(hits)[-1] if hits else ""
    if not base:
        return None
    ref = _timm_name_config(base)
    if ref is None:
        return None
    args: dict[str, Any] = {}
    for ours, theirs in (("embed_dim", "embed_dim"), ("depth", "depth"), ("num_heads", "num_heads")):
        if getattr(cfg, ours) != getattr(ref, ours):
            args[theirs] = getattr(cfg, ours)
    if cfg.mlp_dim != ref.mlp_dim or "embed_dim" in args:
        ratio = cfg.mlp_dim / cfg.embed_dim
        if int(cfg.embed_dim * ratio) != cfg.mlp_dim:  # timm takes int(width x ratio): no rounding down
            ratio = (cfg.mlp_dim + 0.25) / cfg.embed_dim
        args["mlp_ratio"] = ratio
    if cfg.patch_size != ref.patch_size:
        args["patch_size"] = cfg.patch_size
    if cfg.img_size != ref.img_size:
        args["img_size"] = list(cfg.img_size)
    if cfg.reg_tokens != ref.reg_tokens:
        args["num_reg_tokens" if _eva_class(cfg) else "reg_tokens"] = cfg.reg_tokens
    if cfg.in_chans != ref.in_chans:
        args["in_chans"] = cfg.in_chans
    if cfg.rope_ref_grid != ref.rope_ref_grid and cfg.rope_ref_grid is not None:
        args["ref_feat_shape"] = list(cfg.rope_ref_grid)
    if cfg.fc_norm != ref.fc_norm or cfg.pool != ref.pool:  # (timm's default follows global_pool: say it)
        args["use_fc_norm" if _eva_class(cfg) else "fc_norm"] = cfg.fc_norm
    if cfg.dynamic_img_pad and not ref.dynamic_img_pad:
        args["dynamic_img_pad"] = True
        padded = _padded(cfg)
        if padded != cfg.img_size:  # timm's table is img_size // patch: its img_size is the padded one, which holds
            args["img_size"] = list(padded)  # vitlab's grid, and its input may be smaller (the size it pads to)
            args["dynamic_img_size"] = True
    return base, args


def _padded(cfg: ViTConfig) -> tuple[int, int]:
    """The input size ``cfg``'s model pads its images to (``dynamic_img_pad``): each side up to the patch's multiple."""
    p = cfg.patch_size * cfg.stem_stride
    h, w = cfg.img_size
    return -(-h // p) * p, -(-w // p) * p


def _timm_name_config(name: str) -> ViTConfig | None:
    """The configuration timm's ``name`` builds (an alias of a Table 1 name with the fields it implies), or None
    for a name vitlab cannot build (a 384 px input of patch 14)."""
    try:
        if name in TIMM_ALIASES:
            ours, implied = TIMM_ALIASES[name]
            return model_config(ours, **implied)
        return model_config(name)
    except ConfigError:
        return None


def _distance(a: ViTConfig, b: ViTConfig) -> tuple[int, ...]:
    return (abs(a.embed_dim - b.embed_dim), abs(a.patch_size - b.patch_size), abs(a.img_size[0] - b.img_size[0]))


_STRUCTURE = ("stem", "stem_layers", "stem_width", "hybrid_layers", "attention", "head")
"""Fields no keyword argument of timm changes on a name: its stem (a patch embedding, or one ResNet), its attention
(global) and its head (one linear layer: timm has no pre-logits layer)."""


def _same(a: ViTConfig, b: ViTConfig) -> bool:
    """Whether timm's name of config ``a`` builds ``b``'s architecture with keyword arguments (registers and the
    padding of a size the patch does not divide are such: ``reg_tokens``, ``dynamic_img_pad``)."""
    same = families._same_options(a, b, ignore=("dynamic_img_pad", "reg_tokens"))
    structure = all(getattr(a, f) == getattr(b, f) for f in _STRUCTURE)
    return same and structure and a.norm_eps == b.norm_eps  # (the pooling: timm's global_pool)


def _timm_config(cfg: ViTConfig) -> dict[str, Any] | None:
    """timm's Hub ``config.json`` for ``cfg``, or None when no timm name builds it."""
    arch = _timm_architecture(cfg)
    if arch is None:
        return None
    name, args = arch
    pre = pretrained_cfg(cfg)
    pre = {k: v for k, v in pre.items() if k in ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")}
    if cfg.class_names:
        pre["label_names"] = list(cfg.class_names)
    pool = TIMM_POOL.get(cfg.pool, cfg.pool)
    return {
        "architecture": name,
        "num_classes": cfg.num_classes,
        "num_features": cfg.embed_dim,
        "global_pool": pool,
        "model_args": {**args, "num_classes": cfg.num_classes, "global_pool": pool},
        "pretrained_cfg": pre,
    }


# -- writing ----------------------------------------------------------------------------------------------------------
def _write(files: dict[Path, Any], *, overwrite: bool) -> None:
    """Write each ``path: content`` (a state dict, or a JSON object) to a temporary name beside it, then rename all
    into place; an existing file is replaced only with ``overwrite``."""
    from safetensors.torch import save_file

    held = [p for p in files if p.exists()]
    if held and not overwrite:
        raise CheckpointError(f"{held[0]}: already exists; pass --overwrite (overwrite=True) to replace it")
    for p in files:
        refuse_blocked(p, what=p.name)
    temps = {p: temp_path(p) for p in files}
    try:
        for p in files:
            p.parent.mkdir(parents=True, exist_ok=True)
            remove_stale(p.parent, f".{p.name}.tmp")
        for p, content in files.items():
            tmp = temps[p]
            if isinstance(content, dict) and content and all(isinstance(v, torch.Tensor) for v in content.values()):
                if p.suffix.lower() == ".safetensors":
                    save_file(content, str(tmp), metadata={"format": "pt"})
                    os.chmod(tmp, default_file_mode())
                else:
                    torch.save(content, tmp)
            else:
                tmp.write_text(json.dumps(content, indent=2) + "\n")
        for p, tmp in temps.items():
            os.replace(tmp, p)
    except BaseException as e:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        if not isinstance(e, OSError):
            raise
        raise CheckpointError(f"{next(iter(files))}: cannot write ({e.strerror or e})") from None


def write_layout(
    model: nn.Module, dst: str | os.PathLike[str], *, layout: str, overwrite: bool = False
) -> tuple[Path, list[str]]:
    """Write ``model`` in ``layout`` (:data:`LAYOUTS`) at ``dst``: ``(what was written, notes)``; the notes say how
    the other library reads it."""
    cfg: ViTConfig = getattr(model, "config", None)  # type: ignore[assignment]
    if not isinstance(cfg, ViTConfig):
        raise CheckpointError(f"cannot write a {type(model).__name__}: it has no vitlab ViTConfig")
    if layout not in LAYOUTS:
        raise CheckpointError(f"layout: {layout!r} is not one of {', '.join(LAYOUTS)}")
    paths = layout_files(dst, layout)
    cfg, state, notes = _portable(model, layout)
    t = model_temperature(model)
    if t != 1.0 and cfg.num_classes:  # the other library's softmax is the plain one: say how to get vitlab's
        notes.append(
            f"temperature {t:g} (the run's calibration: vitlab predict's probabilities) has no place in the {layout} "
            f"layout, whose logits are the model's own; softmax(logits / {t:g}) gives the calibrated probabilities"
        )
    if layout == "timm":
        config = _timm_config(cfg)
        weights = _timm_weights(cfg, state, target=config["architecture"] if config else None)
        files: dict[Path, Any] = {paths[0]: weights}
        if len(paths) > 1:
            if config is not None:
                files[paths[1]] = config
                arch = config["architecture"]
                notes.append(f"timm: timm.create_model('local-dir:{Path(dst)}', pretrained=True) builds {arch}")
            else:
                notes.append("timm: no timm architecture name has these options; only the weights are written")
        elif config is not None:
            args = ", ".join(f"{k}={v!r}" for k, v in config["model_args"].items())
            notes.append(f"timm: timm.create_model({config['architecture']!r}, {args}) loads it strictly")
    elif layout == "hf" and not (cfg.rope and cfg.rope_kind == "dinov3"):  # the paper's ViT: ViTModel
        bad = hf.unsupported(cfg)
        if bad:
            raise _refuse(cfg, layout, bad, "Hugging Face's ViTModel (and DINOv3ViTModel, for DINOv3)")
        files = {
            paths[0]: hf.vit_state(state, cfg),
            paths[1]: hf.vit_config(cfg),
            paths[2]: hf.vit_preprocessor(cfg),
        }
        cls = hf.vit_config(cfg)["architectures"][0]
        pool = "" if cfg.num_classes or cfg.head == "mlp" else ", add_pooling_layer=False"
        notes.append(f"hf: transformers.{cls}.from_pretrained({str(Path(dst))!r}{pool})")
    else:
        bad = dinov3.unsupported(cfg, layout)
        if bad:
            where = "Hugging Face's DINOv3ViTModel" if layout == "hf" else "Meta's DINOv3 DinoVisionTransformer"
            hint = " (pass --num-classes 0 to leave the classifier out)" if bad == ["num_classes"] else ""
            raise CheckpointError(str(_refuse(cfg, layout, bad, where)) + hint)
        if layout == "hf":
            files = {
                paths[0]: dinov3.to_hf(state, cfg),
                paths[1]: dinov3.hf_config(cfg),
                paths[2]: hf.dinov3_preprocessor(cfg),
            }
            notes.append(f"hf: transformers.DINOv3ViTModel.from_pretrained({str(Path(dst))!r}); pooler_output")
        else:
            files = {paths[0]: dinov3.to_meta(state, cfg)}
            kwargs = dinov3.meta_fields(cfg)
            if len(paths) > 1:
                files[paths[1]] = kwargs
            notes.append("meta: dinov3.models.vision_transformer.DinoVisionTransformer(" + _call(kwargs) + ")")
    _write(files, overwrite=overwrite)
    return (paths[0] if len(paths) == 1 else Path(dst)), notes


def _call(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={round(v, 6) if isinstance(v, float) else v!r}" for k, v in kwargs.items())

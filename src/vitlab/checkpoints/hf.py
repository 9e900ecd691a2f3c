"""Hugging Face ``ViTModel`` / ``ViTForImageClassification`` checkpoints, and the classes with the paper's blocks:
distilled DeiT (``DeiTForImageClassificationWithTeacher``), MAE's encoder (``vit_mae``), DINOv2 (whose fields and
register rows :mod:`.dinov2` reads) and ``DINOv3ViTModel`` folders (whose names :mod:`.dinov3` maps).

A ``save_pretrained`` folder holds ``config.json`` and ``model.safetensors`` (or
``pytorch_model.bin``). Names map onto timm's as in the table of
``docs``/DESIGN.md; the separate ``query``/``key``/``value`` projections are
stacked into one ``qkv`` in that order. Both the on-disk names
(``encoder.layer.N.attention.attention.query``) and those of newer in-memory
models (``layers.N.attention.q_proj``, ``mlp.fc1``) are understood.

``ViTModel``'s pooler (``pooler.dense`` then tanh on the class token) is the
paper's pre-logits layer (Sec. 3.1 / Appendix B.1.1, the i21k releases'
``pre_logits``), so it becomes ``head="mlp"`` with ``pre_logits.fc`` and no
classifier (``num_classes=0``): the model then returns HF's ``pooler_output``.
A ``ViTModel`` saved without pooler returns ``last_hidden_state[:, 0]``.

The config is honoured: ``layer_norm_eps`` (1e-12 in converted Google models)
becomes ``norm_eps``, ``hidden_act`` selects exact or tanh GELU, ``id2label``
becomes ``class_names``, ``preprocessor_config.json``'s mean/std are kept, and its centre crop as
``crop_pct`` (``crop_size / size``, 0.875 for DeiT's processor; 1.0 for ViT's, which resizes without cropping).
A crop to another side than ``image_size`` (DINOv2's processor: 224 px, its config 518) is kept as the side Hugging
Face's pipeline feeds the model (``extra["processor_side"]``), which a fine-tune trains at.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import torch

from ..data.images.resize import resize_side
from ..errors import CheckpointError, ConfigError
from ..models.config import PROCESSOR_SIDE, ViTConfig, check_fields
from . import dinov2
from .dinov3 import HF_MODEL_TYPE, from_hf, hf_fields
from .files import read_config_file, stated_fields

__all__ = [
    "FIELD_NAMES",
    "WEIGHT_FILES",
    "config_fields",
    "convert_state",
    "dinov3_preprocessor",
    "is_hf_folder",
    "is_hf_state",
    "read_folder",
    "unsupported",
    "vit_config",
    "vit_preprocessor",
    "vit_state",
]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_ACTS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu_python_tanh": "gelu_tanh"}
_PATCH = "embeddings.patch_embeddings.projection.weight"
FIELD_NAMES = (
    ("embed_dim", "hidden_size"),
    ("depth", "num_hidden_layers"),
    ("num_heads", "num_attention_heads"),
    ("mlp_dim", "intermediate_size"),
    ("patch_size", "patch_size"),
    ("in_chans", "num_channels"),
    ("qkv_bias", "qkv_bias"),
    ("norm_eps", "layer_norm_eps"),
    ("img_size", "image_size"),
)
"""(ViTConfig field, Hugging Face ``config.json`` key)."""

# (pattern on a name without the "vit." prefix, replacement); first match wins.
_RENAMES: list[tuple[str, str]] = [
    (r"^embeddings\.cls_token$", "cls_token"),
    (r"^embeddings\.distillation_token$", "dist_token"),  # DeiT's (Touvron et al. 2021)
    (r"^embeddings\.register_tokens$", "reg_token"),  # DINOv2's with registers (.dinov2)
    (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.attention\.output\.dense\.", r"blocks.\1.attn.proj."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.attention\.o_proj\.", r"blocks.\1.attn.proj."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.intermediate\.dense\.", r"blocks.\1.mlp.fc1."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.output\.dense\.", r"blocks.\1.mlp.fc2."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.mlp\.(fc[12])\.", r"blocks.\1.mlp.\2."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.layernorm_before\.", r"blocks.\1.norm1."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.layernorm_after\.", r"blocks.\1.norm2."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.(norm[12])\.", r"blocks.\1.\2."),  # DINOv2's names of the two
    (r"^(?:encoder\.layer|layers)\.(\d+)\.layer_scale([12])\.lambda1$", r"blocks.\1.ls\2.gamma"),  # and its scale
    (r"^layernorm\.", "norm."),
    (r"^pooler\.dense\.", "pre_logits.fc."),
    (r"^classifier\.", "head."),
    (r"^cls_classifier\.", "head."),  # DeiTForImageClassificationWithTeacher's two heads
    (r"^distillation_classifier\.", "head_dist."),
]
_QKV = re.compile(
    r"^(?:encoder\.layer|layers)\.(\d+)\.attention\.(?:attention\.(query|key|value)|(q|k|v)_proj)\.(weight|bias)$"
)
_DROPPED = ("embeddings.mask_token",)  # ViTForMaskedImageModeling's [MASK] embedding: not part of the classifier


DEIT_MODEL_TYPE = "deit"
"""``model_type`` of Hugging Face's DeiT classes: the distilled DeiT checkpoints (``facebook/deit-*-distilled-*``,
``DeiTForImageClassificationWithTeacher``); the plain DeiT ones are stored as ``ViTForImageClassification``."""


MAE_MODEL_TYPE = "vit_mae"
"""``model_type`` of Hugging Face's MAE (He et al. 2022; ``facebook/vit-mae-*``, ``ViTMAEForPreTraining`` or
``ViTMAEModel``): the paper's ViT as encoder, its fixed sine-cosine table stored as the position embeddings, and a
decoder that only pre-training uses (left out when it is read, as timm's MAE weights have none)."""


def is_hf_folder(path: str | os.PathLike[str]) -> bool:
    """A folder with a Hugging Face ViT ``config.json`` (``model_type: vit``, ``deit``, ``vit_mae``, DINOv2's or
    DINOv3's). A ``config.json`` that is not a small regular JSON file raises a :class:`CheckpointError` naming it."""
    cfg = Path(path) / "config.json"
    if not os.path.lexists(cfg):
        return False
    kinds = ("vit", DEIT_MODEL_TYPE, MAE_MODEL_TYPE, HF_MODEL_TYPE, *dinov2.MODEL_TYPES)
    return read_config_file(cfg).get("model_type") in kinds


def is_hf_state(state: dict[str, torch.Tensor]) -> bool:
    return any(k.endswith(_PATCH) for k in state)


def convert_state(state: dict[str, torch.Tensor], *, mae: bool = False) -> dict[str, torch.Tensor]:
    """Hugging Face names -> timm/vitlab names (q, k, v stacked into ``qkv``); ``mae``: an MAE folder's, whose
    pre-training decoder (``decoder.*``) is left out."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for key, t in state.items():
        k = re.sub(r"^(?:deit|vit|dinov2)\.", "", key)  # a classifier's model, by its class
        if k in _DROPPED or (mae and key.startswith("decoder.")):
            continue
        m = _QKV.match(k)
        if m:
            part = (m.group(2) or m.group(3))[0]  # q | k | v
            qkv.setdefault((m.group(1), m.group(4)), {})[part] = t
            continue
        for pat, rep in _RENAMES:
            new, n = re.subn(pat, rep, k)
            if n:
                out[new] = t
                break
        else:
            out[key] = t  # unknown: reported as unexpected by the loader
    for (i, kind), parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(f"layer {i}: attention {kind} has only {', '.join(sorted(parts))} of query/key/value")
        out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out


def config_fields(raw: dict[str, Any], *, has_pooler: bool, source: str = "config.json") -> dict[str, Any]:
    """ViTConfig fields from a Hugging Face ``config.json``, each type- and range-checked: a bad
    value is a :class:`CheckpointError` naming ``source`` and the Hugging Face key."""
    f = stated_fields(raw, FIELD_NAMES, source=source)
    act = raw.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in _ACTS:
        raise CheckpointError(
            f"{source}: hidden_act {act!r:.60} is not supported (vitlab has exact and tanh GELU: {', '.join(_ACTS)})"
        )
    f["act"] = _ACTS[act]
    if has_pooler and raw.get("pooler_act", "tanh") != "tanh":
        raise CheckpointError(
            f"{source}: pooler_act {raw['pooler_act']!r:.60} is not supported; vitlab's pre-logits layer uses tanh"
        )
    labels = raw.get("id2label")
    if labels is not None and not (
        isinstance(labels, dict)
        and all(isinstance(k, str) and k.isdigit() and len(k) < 10 and isinstance(v, str) for k, v in labels.items())
    ):
        raise CheckpointError(f"{source}: id2label: expected an object of class index -> name strings")
    if labels:
        names = [labels[k] for k in sorted(labels, key=int)]
        if sorted(map(int, labels)) != list(range(len(labels))):
            raise CheckpointError(f"{source}: id2label: the class indices are not 0 .. {len(labels) - 1}")
        if not all(re.fullmatch(rf"LABEL_{i}", n) for i, n in enumerate(names)):  # HF's placeholder names
            f["class_names"] = names
    return f


def read_folder(
    path: str | os.PathLike[str], *, max_unpacked_bytes: int | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(state dict in vitlab names, config fields)`` of a ``save_pretrained`` folder."""
    from .files import read_state_dict

    p = Path(path)
    raw = read_config_file(p / "config.json")
    weights = next((p / n for n in WEIGHT_FILES if (p / n).is_file()), None)
    if weights is None:
        if (p / "model.safetensors.index.json").is_file() or (p / "pytorch_model.bin.index.json").is_file():
            raise CheckpointError(
                f"{p}: sharded checkpoints are not supported; re-save with save_pretrained(max_shard_size='100GB')"
            )
        raise CheckpointError(f"{p}: a Hugging Face config.json but no {' or '.join(WEIGHT_FILES)}")
    if raw.get("model_type") in dinov2.MODEL_TYPES:  # Dinov2Model, Dinov2WithRegistersModel (.dinov2)
        state_hf = read_state_dict(weights, max_unpacked_bytes=max_unpacked_bytes)
        fields = dinov2.fields(raw, state_hf, source=str(p))
        state = dinov2.with_register_rows(convert_state(state_hf), fields["reg_tokens"])
    elif raw.get("model_type") == HF_MODEL_TYPE:  # DINOv3ViTModel (.dinov3)
        state, implied = from_hf(read_state_dict(weights, max_unpacked_bytes=max_unpacked_bytes), source=str(weights))
        fields = {**hf_fields(raw, source=str(p / "config.json")), **implied, "extra": {"family": "DINOv3"}}
    else:
        mae = raw.get("model_type") == MAE_MODEL_TYPE
        state = convert_state(read_state_dict(weights, max_unpacked_bytes=max_unpacked_bytes), mae=mae)
        fields = config_fields(raw, has_pooler="pre_logits.fc.weight" in state, source=str(p / "config.json"))
        if mae:  # the encoder, as a backbone: its class token after the final norm (no classifier was trained)
            fields["num_classes"] = 0
        if raw.get("model_type") == DEIT_MODEL_TYPE and "head_dist.weight" not in state:
            raise CheckpointError(
                f"{p}: a Hugging Face DeiT folder without the distillation head (DeiTForImageClassification or "
                "DeiTModel): its distillation token is attended to but no head reads it, which vitlab's DeiT (the "
                "paper's and timm's, both heads averaged) does not compute; not loaded"
            )
    pre_path = p / "preprocessor_config.json"
    if os.path.lexists(pre_path):
        pre = read_config_file(pre_path)
        if "image_mean" in pre and "image_std" in pre:
            try:
                norm = check_fields({"mean": pre["image_mean"], "std": pre["image_std"]})
            except ConfigError as e:
                raise CheckpointError(f"{pre_path}: image_{e}") from None
            fields["mean"], fields["std"] = norm["mean"], norm["std"]
        crop = _crop_pct(pre, pre_path)
        if crop is not None:
            fields["crop_pct"] = crop
            size = fields.get("img_size")  # (config.json's image_size: an int, or a pair)
            table = size if isinstance(size, int) else size[0] if size else None
            if (fed := _side(pre.get("crop_size"), ("height",))) is not None and fed != table:
                fields["extra"] = {**fields.get("extra", {}), PROCESSOR_SIDE: fed}  # (DINOv2's 224 for 518 px)
    return state, fields


def _side(value: Any, keys: tuple[str, ...]) -> int | None:
    """The side an image processor's ``size`` or ``crop_size`` states (an int, or a dict with one of ``keys``)."""
    if isinstance(value, dict):
        value = next((value[k] for k in keys if k in value), None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _crop_pct(pre: dict[str, Any], source: Path) -> float | None:
    """timm's ``crop_pct`` of an image processor that resizes then crops the centre (DeiT's: 256 px, then 224),
    or None for one that resizes straight to the input size (ViT's: vitlab's default, 1.0)."""
    if pre.get("do_center_crop") is not True:
        return None
    crop = _side(pre.get("crop_size"), ("height",))
    size = _side(pre.get("size"), ("height", "shortest_edge"))
    if crop is None or size is None or crop > size:
        raise CheckpointError(
            f"{source}: do_center_crop with size {pre.get('size')!r:.60} and crop_size {pre.get('crop_size')!r:.60}: "
            "expected positive sides, the crop no larger than the size"
        )
    pct = crop / size
    if resize_side(crop, pct) != size:  # (64 / (64 / 73) is 72.99...: the next smaller float resizes to 73)
        pct = math.nextafter(pct, 0.0)
    return pct


def unsupported(cfg: ViTConfig) -> list[str]:
    """The options of ``cfg`` Hugging Face's ``ViTModel`` / ``ViTForImageClassification`` do not have."""
    bad = {
        "class_token": not cfg.class_token,
        "dist_token": cfg.dist_token and not cfg.num_classes,  # (DeiT's with heads: ...WithTeacher)
        "reg_tokens": cfg.reg_tokens > 0,
        "posemb": cfg.posemb != "learn",
        "pool": cfg.pool != "cls",
        "init_values": cfg.init_values is not None,
        "qk_norm": cfg.qk_norm,
        "pre_norm": cfg.pre_norm,
        "key_bias": cfg.qkv_bias and not cfg.key_bias,
        "mlp": cfg.mlp != "mlp",
        "mlp_norm": cfg.mlp_norm,
        "attn_norm": cfg.attn_norm,
        "rope": cfg.rope,
        "act": cfg.act not in ("gelu", "gelu_tanh"),
        "num_classes": cfg.head == "mlp" and cfg.num_classes > 0,
        "hybrid_layers": cfg.hybrid_layers is not None or cfg.stem != "patch" or cfg.attention != "global",
        "dynamic_img_pad": cfg.dynamic_img_pad
        and bool(cfg.img_size[0] % cfg.patch_size or cfg.img_size[1] % cfg.patch_size),
    }
    return [k for k, v in bad.items() if v]


def vit_config(cfg: ViTConfig) -> dict[str, Any]:
    """Hugging Face's ``config.json`` for ``cfg``: ``ViTForImageClassification`` with a classifier, else
    ``ViTModel`` (its pooler is the ``mlp`` head's pre-logits layer); DeiT's distilled model (a distillation token
    and its head) is ``DeiTForImageClassificationWithTeacher``, whose logits average the two heads as vitlab's."""
    h, w = cfg.img_size
    arch = "ViTForImageClassification" if cfg.num_classes else "ViTModel"
    out: dict[str, Any] = {
        "architectures": ["DeiTForImageClassificationWithTeacher" if cfg.dist_token else arch],
        "model_type": DEIT_MODEL_TYPE if cfg.dist_token else "vit",
        "hidden_size": cfg.embed_dim,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}[cfg.act],
        "layer_norm_eps": cfg.norm_eps,
        "image_size": h if h == w else [h, w],
        "patch_size": cfg.patch_size,
        "num_channels": cfg.in_chans,
        "qkv_bias": cfg.qkv_bias,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    if cfg.head == "mlp":
        out.update(pooler_act="tanh", pooler_output_size=cfg.pre_logits_dim)
    if cfg.num_classes:
        names = cfg.class_names or [f"LABEL_{i}" for i in range(cfg.num_classes)]
        out["id2label"] = {str(i): n for i, n in enumerate(names)}
        out["label2id"] = {n: i for i, n in enumerate(names)}
    return out


def vit_state(state: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab's names -> those ``save_pretrained`` writes for a ViT (the reverse of :func:`convert_state`)."""
    pre = ("deit." if cfg.dist_token else "vit.") if cfg.num_classes else ""
    out: dict[str, torch.Tensor] = {}
    for k, t in state.items():
        m = re.fullmatch(r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)", k)
        if m:
            for part, x in zip(("query", "key", "value"), t.chunk(3)):
                out[f"{pre}encoder.layer.{m.group(1)}.attention.attention.{part}.{m.group(2)}"] = x
            continue
        for pat, rep in (
            (r"cls_token", "embeddings.cls_token"),
            (r"pos_embed", "embeddings.position_embeddings"),
            (r"patch_embed\.proj\.(weight|bias)", r"embeddings.patch_embeddings.projection.\1"),
            (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", r"encoder.layer.\1.attention.output.dense.\2"),
            (r"blocks\.(\d+)\.mlp\.fc1\.(weight|bias)", r"encoder.layer.\1.intermediate.dense.\2"),
            (r"blocks\.(\d+)\.mlp\.fc2\.(weight|bias)", r"encoder.layer.\1.output.dense.\2"),
            (r"blocks\.(\d+)\.norm1\.(weight|bias)", r"encoder.layer.\1.layernorm_before.\2"),
            (r"blocks\.(\d+)\.norm2\.(weight|bias)", r"encoder.layer.\1.layernorm_after.\2"),
            (r"norm\.(weight|bias)", r"layernorm.\1"),
            (r"pre_logits\.fc\.(weight|bias)", r"pooler.dense.\1"),
        ):
            if re.fullmatch(pat, k):
                out[pre + re.sub(pat, rep, k)] = t
                break
        else:
            if k == "dist_token":
                out[pre + "embeddings.distillation_token"] = t
            elif k.startswith("head_dist."):
                out["distillation_classifier." + k[len("head_dist.") :]] = t
            elif k.startswith("head."):
                out[("cls_classifier." if cfg.dist_token else "classifier.") + k[len("head.") :]] = t
    return out


def vit_preprocessor(cfg: ViTConfig) -> dict[str, Any]:
    """``preprocessor_config.json`` that gives Hugging Face's ``pipeline("image-classification")`` and
    ``AutoImageProcessor`` vitlab's evaluation pixels (:func:`vitlab.data.eval_transform`, timm's rule): the shorter
    side resized (bicubic) to the model's side over its ``crop_pct``, the centre crop at the model's size, its mean and
    std. ``ViTImageProcessor`` cannot say this (it squashes every image to the input size, bilinear, which changes
    many top-1 classes of photos: docs/backbones.md), so the processor is ``CLIPImageProcessor``, which transformers
    4 and 5 read the same way: ``size.shortest_edge`` and a ``crop_size``. A non-square model is resized to its size
    over ``crop_pct`` whatever the aspect ratio, as vitlab resizes it."""
    h, w = cfg.img_size
    size: dict[str, int] = {"shortest_edge": resize_side(h, cfg.crop_pct)}
    if h != w:
        size = {"height": resize_side(h, cfg.crop_pct), "width": resize_side(w, cfg.crop_pct)}
    return {
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True,
        "size": size,
        "resample": 3,  # PIL's BICUBIC
        "do_center_crop": True,
        "crop_size": {"height": h, "width": w},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(cfg.mean),
        "image_std": list(cfg.std),
        "do_convert_rgb": cfg.in_chans == 3,
    }


def dinov3_preprocessor(cfg: ViTConfig) -> dict[str, Any]:
    """``preprocessor_config.json`` of Hugging Face's ``DINOv3ViTImageProcessor`` with the model's mean, std and
    input size: DINOv3's own processor (it resizes to the input size without a crop), kept for its model class."""
    h, w = cfg.img_size
    return {
        "image_processor_type": "DINOv3ViTImageProcessor",
        "do_resize": True,
        "size": {"height": h, "width": w},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(cfg.mean),
        "image_std": list(cfg.std),
    }

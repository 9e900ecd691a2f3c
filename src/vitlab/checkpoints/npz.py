"""Google's ``.npz`` checkpoints: the official ``vit_jax`` layout and big_vision's.

vit_jax (``google-research/vision_transformer``; optional ``opt/target/`` prefix)::

    embedding/{kernel (P,P,C,D) HWIO, bias}   cls (1,1,D)   pre_logits/{kernel,bias}   head/{kernel,bias}
    Transformer/posembed_input/pos_embedding (1, 1+N, D)  (class row included)
    Transformer/encoderblock_i/{LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2, MlpBlock_3/Dense_0|1}
    Transformer/encoder_norm/{scale,bias}

big_vision (``params/`` prefix): sub-modules numbered from 0 (``MultiHeadDotProductAttention_0``,
``LayerNorm_1``, ``MlpBlock_0``); ``pos_embedding`` (1, N, D) sits at the top level and has no
class row (the class token, present only for token pooling, gets no position embedding, i.e. a
zero class row here); with ``scan=True`` all layers are one ``Transformer/encoderblock/...``
whose arrays carry a leading depth axis.

Flax stores dense kernels as (in, out) and attention kernels per head: q/k/v (D, H, Dh),
out (H, Dh, D); they become timm's ``qkv`` (3D, D) and ``proj`` (D, D). The head count is
read from these shapes. Hybrid checkpoints (``R50+ViT-B_16.npz``) add the BiT ResNet
(``conv_root``, ``gn_root``, ``block<i>/unit<j>/...``) that feeds the 1x1 patch embedding.
The official models use tanh-GELU and inputs in [-1, 1], and resample position
embeddings with ``scipy.ndimage.zoom(order=1)``: the defaults set here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointError
from ..models.config import ViTConfig
from .files import parse_config, read_npz
from .vitlab_folder import config_from_record

__all__ = ["CONFIG_KEY", "PREFIXES", "read_checkpoint"]

CONFIG_KEY = "vitlab/config"
"""The array in which :func:`write_npz` stores vitlab's configuration (the UTF-8 bytes of its JSON, as uint8):
what the Google layouts cannot say (the GELU variant, preprocessing, class names ...) for vitlab to read back."""

PREFIXES = ("", "opt/target/", "params/")
_POSEMB_VIT_JAX = "Transformer/posembed_input/pos_embedding"


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def _resnet(w: Mapping[str, np.ndarray], prefix: str, get) -> dict[str, torch.Tensor]:
    """The hybrid's BiT ResNet (``conv_root``, ``gn_root``, ``block<i>/unit<j>/{conv,gn}<r>``,
    ``conv_proj``/``gn_proj``) in vitlab's ``patch_embed.backbone`` names; kernels HWIO -> OIHW."""

    def conv(name: str) -> torch.Tensor:
        return _t(get(name).transpose(3, 2, 0, 1))

    def gn(name: str) -> torch.Tensor:
        return _t(get(name).reshape(-1))  # stored as (C,) or (1, 1, 1, C)

    units: dict[int, set[int]] = {}
    for k in w:
        m = re.match(rf"{re.escape(prefix)}block(\d+)/unit(\d+)/", k)
        if m:
            units.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    layers = [len(units[i]) for i in sorted(units)]
    stem = "patch_embed.backbone.stem." if layers else "patch_embed.backbone."  # stem-only backbones: no "stem." level
    out = {
        stem + "conv.weight": conv("conv_root/kernel"),
        stem + "norm.weight": gn("gn_root/scale"),
        stem + "norm.bias": gn("gn_root/bias"),
    }
    for i, n in enumerate(layers):
        for j in range(n):
            src, dst = f"block{i + 1}/unit{j + 1}/", f"patch_embed.backbone.stages.{i}.blocks.{j}."
            for r in (1, 2, 3):
                out[f"{dst}conv{r}.weight"] = conv(f"{src}conv{r}/kernel")
                out[f"{dst}norm{r}.weight"], out[f"{dst}norm{r}.bias"] = gn(f"{src}gn{r}/scale"), gn(f"{src}gn{r}/bias")
            if f"{prefix}{src}conv_proj/kernel" in w:
                out[f"{dst}downsample.conv.weight"] = conv(f"{src}conv_proj/kernel")
                out[f"{dst}downsample.norm.weight"], out[f"{dst}downsample.norm.bias"] = (
                    gn(f"{src}gn_proj/scale"),
                    gn(f"{src}gn_proj/bias"),
                )
    return out


def _map_head(get) -> dict[str, torch.Tensor]:
    """big_vision's ``MAPHead_0`` (probe, attention, LayerNorm, MLP) in timm's ``attn_pool`` names."""
    mha = "MAPHead_0/MultiHeadDotProductAttention_0/"

    def dense(name: str) -> torch.Tensor:  # (D, H, Dh) -> (H*Dh, D)
        k = get(f"{mha}{name}/kernel")
        return _t(k.reshape(k.shape[0], -1).T)

    out = get(f"{mha}out/kernel")
    state = {
        "attn_pool.latent": _t(get("MAPHead_0/probe")).reshape(1, 1, -1),
        "attn_pool.q.weight": dense("query"),
        "attn_pool.q.bias": _t(get(f"{mha}query/bias").reshape(-1)),
        "attn_pool.kv.weight": torch.cat([dense("key"), dense("value")]),
        "attn_pool.kv.bias": torch.cat([_t(get(f"{mha}{n}/bias").reshape(-1)) for n in ("key", "value")]),
        "attn_pool.proj.weight": _t(out.reshape(-1, out.shape[-1]).T),
        "attn_pool.proj.bias": _t(get(f"{mha}out/bias")),
        "attn_pool.norm.weight": _t(get("MAPHead_0/LayerNorm_0/scale")),
        "attn_pool.norm.bias": _t(get("MAPHead_0/LayerNorm_0/bias")),
    }
    for j in (0, 1):
        state[f"attn_pool.mlp.fc{j + 1}.weight"] = _t(get(f"MAPHead_0/MlpBlock_0/Dense_{j}/kernel").T)
        state[f"attn_pool.mlp.fc{j + 1}.bias"] = _t(get(f"MAPHead_0/MlpBlock_0/Dense_{j}/bias"))
    return state


def read_checkpoint(
    path: str | os.PathLike[str], *, max_unpacked_bytes: int | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any], ViTConfig | None]:
    """``(state dict in vitlab names, config fields, vitlab's stored config or None)`` of a vit_jax or
    big_vision ``.npz``. The stored config (:data:`CONFIG_KEY`, written by :func:`write_npz`) is checked as a
    ``config.json`` is, and against the head count of the attention kernels.

    Only the arrays the model needs are decompressed (optimizer state, for one, is not), within
    the bound of :func:`~vitlab.checkpoints.files.unpacked_limit`."""
    with read_npz(path, max_unpacked_bytes=max_unpacked_bytes) as w:
        state, fields = _convert(w, path)
        cfg = _stored_config(w, path) if CONFIG_KEY in w else None
    if cfg is None:
        return state, fields, None
    where = f"{path} ({CONFIG_KEY})"
    if cfg.num_heads != fields.get("num_heads", cfg.num_heads):
        raise CheckpointError(
            f"{where}: num_heads is {cfg.num_heads} but the attention kernels have {fields['num_heads']} heads; "
            "the config does not describe these weights"
        )
    if not cfg.qkv_bias:  # the layouts always hold q/k/v biases: write_npz stored zeros
        for k in [k for k in state if k.endswith("attn.qkv.bias")]:
            if state.pop(k).any():
                raise CheckpointError(f"{where}: qkv_bias is false but the weights have a non-zero {k}")
    return state, fields, cfg


def _stored_config(w: Mapping[str, np.ndarray], path: str | os.PathLike[str]) -> ViTConfig:
    where = f"{path} ({CONFIG_KEY})"
    a = w[CONFIG_KEY]
    if a.dtype != np.uint8 or a.ndim != 1:
        raise CheckpointError(f"{where}: a {a.dtype} array of shape {a.shape}, not the UTF-8 bytes of a JSON config")
    return config_from_record(parse_config(a.tobytes(), where=where), where=where)


def _convert(
    w: Mapping[str, np.ndarray], path: str | os.PathLike[str]
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    prefix = next((p for p in PREFIXES if f"{p}embedding/kernel" in w), None)
    if prefix is None:
        sample = ", ".join(sorted(w)[:5]) or "none"
        raise CheckpointError(
            f"{path}: not a ViT .npz: no 'embedding/kernel' under any of the prefixes '', 'opt/target/', 'params/' "
            f"(keys: {sample})"
        )

    def get(name: str, idx: int | None = None) -> np.ndarray:
        key = prefix + name
        if key not in w:
            raise CheckpointError(f"{path}: missing array {key!r}")
        a = w[key]
        return a[idx] if idx is not None else a

    state: dict[str, torch.Tensor] = {}
    fields: dict[str, Any] = {
        "act": "gelu_tanh",
        "posemb_resample": "jax",
        "norm_eps": 1e-6,
        "mean": (0.5,) * 3,
        "std": (0.5,) * 3,
    }

    state["patch_embed.proj.weight"] = _t(get("embedding/kernel").transpose(3, 2, 0, 1))
    state["patch_embed.proj.bias"] = _t(get("embedding/bias"))
    has_cls = f"{prefix}cls" in w
    if has_cls:
        state["cls_token"] = _t(get("cls")).reshape(1, 1, -1)

    patches_only = False  # big_vision's table: the patches' rows only (its class token is prepended after it)
    if f"{prefix}{_POSEMB_VIT_JAX}" in w:
        pe = get(_POSEMB_VIT_JAX)
    elif f"{prefix}pos_embedding" in w:
        pe, patches_only = get("pos_embedding"), True
    else:
        pe = None
        fields["posemb"] = "sincos2d"  # big_vision's fixed embedding stores no array
    if pe is not None:
        pe = _t(pe).reshape(1, -1, pe.shape[-1])
        if has_cls and patches_only:  # (by the array's name, not its length: a 4 x 5 grid is no square either way)
            pe = torch.cat([pe.new_zeros(1, 1, pe.shape[2]), pe], dim=1)
        state["pos_embed"] = pe

    state["norm.weight"] = _t(get("Transformer/encoder_norm/scale"))
    state["norm.bias"] = _t(get("Transformer/encoder_norm/bias"))
    if f"{prefix}pre_logits/kernel" in w:
        state["pre_logits.fc.weight"] = _t(get("pre_logits/kernel").T)
        state["pre_logits.fc.bias"] = _t(get("pre_logits/bias"))
    if f"{prefix}head/kernel" in w:
        state["head.weight"] = _t(get("head/kernel").T)
        state["head.bias"] = _t(get("head/bias"))
    if f"{prefix}MAPHead_0/probe" in w:  # big_vision's attention pooling (SigLIP): timm's attn_pool names
        state.update(_map_head(get))

    if f"{prefix}conv_root/kernel" in w:
        state.update(_resnet(w, prefix, get))

    scanned = f"{prefix}Transformer/encoderblock/LayerNorm_0/scale" in w
    if scanned:
        depth = w[f"{prefix}Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
        block_of = [("Transformer/encoderblock/", i) for i in range(depth)]
    else:
        ids = sorted(
            {int(m.group(1)) for k in w if (m := re.match(rf"{re.escape(prefix)}Transformer/encoderblock_(\d+)/", k))}
        )
        if ids != list(range(len(ids))) or not ids:
            raise CheckpointError(
                f"{path}: transformer layers numbered {ids[:8]}..., expected encoderblock_0 .. encoderblock_N-1"
            )
        block_of = [(f"Transformer/encoderblock_{i}/", None) for i in ids]

    first = prefix + block_of[0][0]
    # vit_jax numbers the sub-modules of a block in creation order (LayerNorm_0, MHA_1, LayerNorm_2,
    # MlpBlock_3); big_vision names each kind from 0. Detect which, rather than trusting the prefix.
    mha = (
        "MultiHeadDotProductAttention_1"
        if f"{first}MultiHeadDotProductAttention_1/query/kernel" in w
        else "MultiHeadDotProductAttention_0"
    )
    ln2 = "LayerNorm_2" if f"{first}LayerNorm_2/scale" in w else "LayerNorm_1"
    mlp = "MlpBlock_3" if f"{first}MlpBlock_3/Dense_0/kernel" in w else "MlpBlock_0"

    for i, (bp, idx) in enumerate(block_of):
        o = f"blocks.{i}."
        state[o + "norm1.weight"] = _t(get(bp + "LayerNorm_0/scale", idx))
        state[o + "norm1.bias"] = _t(get(bp + "LayerNorm_0/bias", idx))
        qkv_w, qkv_b = [], []
        for part in ("query", "key", "value"):
            k = get(f"{bp}{mha}/{part}/kernel", idx)  # (D, H, Dh)
            if i == 0:
                fields["num_heads"] = int(k.shape[1])
            qkv_w.append(_t(k.reshape(k.shape[0], -1).T))
            qkv_b.append(_t(get(f"{bp}{mha}/{part}/bias", idx).reshape(-1)))
        state[o + "attn.qkv.weight"] = torch.cat(qkv_w, 0)
        state[o + "attn.qkv.bias"] = torch.cat(qkv_b, 0)
        out = get(f"{bp}{mha}/out/kernel", idx)  # (H, Dh, D)
        state[o + "attn.proj.weight"] = _t(out.reshape(-1, out.shape[-1]).T)
        state[o + "attn.proj.bias"] = _t(get(f"{bp}{mha}/out/bias", idx))
        state[o + "norm2.weight"] = _t(get(f"{bp}{ln2}/scale", idx))
        state[o + "norm2.bias"] = _t(get(f"{bp}{ln2}/bias", idx))
        for j in (0, 1):
            state[o + f"mlp.fc{j + 1}.weight"] = _t(get(f"{bp}{mlp}/Dense_{j}/kernel", idx).T)
            state[o + f"mlp.fc{j + 1}.bias"] = _t(get(f"{bp}{mlp}/Dense_{j}/bias", idx))
    layout = "big_vision" if (prefix == "params/" or mha.endswith("_0")) else "vit_jax"
    fields["extra"] = {"source_format": f"npz ({layout}{', scanned' if scanned else ''})"}
    return state, fields

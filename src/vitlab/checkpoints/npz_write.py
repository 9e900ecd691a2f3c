"""Writing a ViT as Google's ``.npz`` (vit_jax or big_vision layout), the reverse of
:func:`vitlab.checkpoints.npz.read_checkpoint`, with vitlab's configuration stored under
:data:`~vitlab.checkpoints.npz.CONFIG_KEY` so that vitlab -> npz -> vitlab is exact."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..models.config import ViTConfig
from .npz import _POSEMB_VIT_JAX, CONFIG_KEY
from .vitlab_folder import config_record

__all__ = ["LAYOUTS", "outside_layout", "write_npz"]


LAYOUTS = ("vit_jax", "big_vision")


def outside_layout(cfg: ViTConfig) -> list[str]:
    """The fields of ``cfg`` that a reader of the Google layouts without :data:`CONFIG_KEY` would take
    otherwise (it assumes tanh-GELU, inputs in [-1, 1], 224 px without learned position embeddings ...):
    what only vitlab reads back from an ``.npz`` :func:`write_npz` wrote."""
    lost = {
        "act": cfg.act != "gelu_tanh",
        "norm_eps": cfg.norm_eps != 1e-6,
        "mean": tuple(cfg.mean) != (0.5,) * 3,
        "std": tuple(cfg.std) != (0.5,) * 3,
        "class_names": cfg.class_names is not None,
        "posemb": cfg.posemb == "none",
        "img_size": cfg.posemb != "learn" and tuple(cfg.img_size) != (224, 224),
        "qkv_bias": not cfg.qkv_bias,
        "rope": cfg.rope,
        "dynamic_img_pad": cfg.dynamic_img_pad,
    }
    return [k for k, v in lost.items() if v]


def write_npz(model: Any, path: str | os.PathLike[str], *, layout: str = "vit_jax", overwrite: bool = False) -> Path:
    """Write a ViT's weights as Google's ``.npz``, the reverse of :func:`read_checkpoint`.

    ``vit_jax``: the official layout (``Transformer/encoderblock_i/MultiHeadDotProductAttention_1``,
    class row inside ``Transformer/posembed_input/pos_embedding``); ``big_vision``: ``params/``
    prefix, sub-modules numbered from 0, ``pos_embedding`` without a class row (the class row is
    folded into ``cls``: big_vision adds no position embedding to the class token) and a
    ``MAPHead_0`` for attention pooling. Options without a Google layout (hybrid and convolutional stems, axial,
    2-D learned position embeddings, registers, layer scale, qk-norm, distillation, sequence pooling, SwiGLU, q/v-only
    biases, NormFormer norms, the Perception Encoder's pooling) are refused.
    The file is written beside ``path`` and renamed over it; an existing ``path`` needs ``overwrite=True``."""
    from .._fs import refuse_blocked, replacing
    from ..errors import ConfigError

    path = Path(path)
    refuse_blocked(path, what=path.name)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path}: already exists; pass overwrite=True (--overwrite) to replace it")

    if layout not in LAYOUTS:
        raise ConfigError(f"layout: {layout!r} is not one of {', '.join(LAYOUTS)}")
    cfg = model.config
    unsupported = {
        "hybrid_layers": cfg.hybrid_layers is not None,
        "stem": cfg.stem != "patch",
        "attention": cfg.attention != "global",
        "posemb": cfg.posemb == "learn2d",
        "reg_tokens": cfg.reg_tokens > 0,
        "init_values": cfg.init_values is not None,
        "qk_norm": cfg.qk_norm,
        "pre_norm": cfg.pre_norm,
        "dist_token": cfg.dist_token,
        "pool": cfg.pool == "seq" or (cfg.pool == "map" and layout == "vit_jax"),
        "fc_norm": cfg.fc_norm,
        "mlp": cfg.mlp != "mlp",
        "key_bias": cfg.qkv_bias and not cfg.key_bias,
        "attn_norm": cfg.attn_norm,
        "mlp_norm": cfg.mlp_norm,
        "pool_include_prefix": cfg.pool_include_prefix,
        "map_heads": cfg.map_heads is not None,
        "map_mlp_dim": cfg.map_mlp_dim is not None,
    }
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise ConfigError(f"{bad[0]}: {getattr(cfg, bad[0])!r} has no {layout} .npz layout; it cannot be written")
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    h = cfg.num_heads
    bv = layout == "big_vision"
    pre = "params/" if bv else ""
    out: dict[str, np.ndarray] = {}

    def put(name: str, a: np.ndarray) -> None:
        out[pre + name] = np.ascontiguousarray(a, dtype=np.float32)

    def attention(dst: str, q: np.ndarray, qb: np.ndarray, kv: list[tuple[str, np.ndarray, np.ndarray]]) -> None:
        for part, w, b in [("query", q, qb), *kv]:
            put(f"{dst}{part}/kernel", w.T.reshape(w.shape[1], h, -1))  # (out, D) -> (D, H, Dh)
            put(f"{dst}{part}/bias", b.reshape(h, -1))

    def dense(dst: str, src: str) -> None:
        put(f"{dst}/kernel", sd[f"{src}.weight"].T)
        put(f"{dst}/bias", sd[f"{src}.bias"])

    put("embedding/kernel", sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0))  # OIHW -> HWIO
    put("embedding/bias", sd["patch_embed.proj.bias"])
    pe = sd.get("pos_embed")
    n_pre = cfg.num_prefix_tokens
    if "cls_token" in sd:
        cls = sd["cls_token"] + (pe[:, :1] if bv and pe is not None else 0)
        put("cls", cls)
    if pe is not None:
        put("pos_embedding" if bv else _POSEMB_VIT_JAX, pe[:, n_pre:] if bv else pe)
    mha, ln2, mlp = (
        ("MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")
        if bv
        else (
            "MultiHeadDotProductAttention_1",
            "LayerNorm_2",
            "MlpBlock_3",
        )
    )
    d = cfg.embed_dim
    for i in range(cfg.depth):
        src, dst = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        put(f"{dst}LayerNorm_0/scale", sd[src + "norm1.weight"])
        put(f"{dst}LayerNorm_0/bias", sd[src + "norm1.bias"])
        w, b = sd[src + "attn.qkv.weight"], sd.get(src + "attn.qkv.bias", np.zeros(3 * d, np.float32))
        parts = [(w[j * d : (j + 1) * d], b[j * d : (j + 1) * d]) for j in range(3)]
        attention(f"{dst}{mha}/", *parts[0], [("key", *parts[1]), ("value", *parts[2])])
        put(f"{dst}{mha}/out/kernel", sd[src + "attn.proj.weight"].T.reshape(h, -1, d))  # (D, H*Dh) -> (H, Dh, D)
        put(f"{dst}{mha}/out/bias", sd[src + "attn.proj.bias"])
        put(f"{dst}{ln2}/scale", sd[src + "norm2.weight"])
        put(f"{dst}{ln2}/bias", sd[src + "norm2.bias"])
        dense(f"{dst}{mlp}/Dense_0", src + "mlp.fc1")
        dense(f"{dst}{mlp}/Dense_1", src + "mlp.fc2")
    put("Transformer/encoder_norm/scale", sd["norm.weight"])
    put("Transformer/encoder_norm/bias", sd["norm.bias"])
    if cfg.pool == "map":
        m = "MAPHead_0/"
        put(f"{m}probe", sd["attn_pool.latent"])
        kv, kvb = sd["attn_pool.kv.weight"], sd["attn_pool.kv.bias"]
        attention(
            f"{m}MultiHeadDotProductAttention_0/",
            sd["attn_pool.q.weight"],
            sd["attn_pool.q.bias"],
            [("key", kv[:d], kvb[:d]), ("value", kv[d:], kvb[d:])],
        )
        put(f"{m}MultiHeadDotProductAttention_0/out/kernel", sd["attn_pool.proj.weight"].T.reshape(h, -1, d))
        put(f"{m}MultiHeadDotProductAttention_0/out/bias", sd["attn_pool.proj.bias"])
        put(f"{m}LayerNorm_0/scale", sd["attn_pool.norm.weight"])
        put(f"{m}LayerNorm_0/bias", sd["attn_pool.norm.bias"])
        dense(f"{m}MlpBlock_0/Dense_0", "attn_pool.mlp.fc1")
        dense(f"{m}MlpBlock_0/Dense_1", "attn_pool.mlp.fc2")
    if "pre_logits.fc.weight" in sd:
        dense("pre_logits", "pre_logits.fc")
    if "head.weight" in sd:
        dense("head", "head")
    record = json.dumps(config_record(cfg, architecture=type(model).__name__)).encode("utf-8")
    out[CONFIG_KEY] = np.frombuffer(record, dtype=np.uint8)  # outside the layout's names; no pickle
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, what="the .npz") as tmp, open(tmp, "wb") as f:  # (a link at path is replaced, not followed)
        np.savez(f, **out)
    return path

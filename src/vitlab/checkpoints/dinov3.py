"""DINOv3 (Simeoni et al. 2025) in the layouts of its other two homes: Meta's release and Hugging Face's port.
(timm's port is :mod:`.families`.) Each is read into vitlab's names with the fields its files state, and
written back so that the other library loads it strictly with the same features.

===================  ====================================  ====================================  ====================
tensor               Meta (``dinov3/models``)              Hugging Face (``DINOv3ViTModel``)     vitlab (= timm's,
                                                                                                 ``ls`` renamed)
===================  ====================================  ====================================  ====================
class token          ``cls_token``                         ``embeddings.cls_token``              ``cls_token``
registers            ``storage_tokens``                    ``embeddings.register_tokens``        ``reg_token``
[MASK] (pretrain)    ``mask_token`` (1, D)                 ``embeddings.mask_token`` (1, 1, D)   (dropped)
patch projection     ``patch_embed.proj``                  ``embeddings.patch_embeddings``       ``patch_embed.proj``
RoPE periods         ``rope_embed.periods`` (checked)      (rebuilt)                             (rebuilt)
q, k, v              ``blocks.N.attn.qkv`` (+ ``bias_mask``  ``layer.N.attention.{q,k,v}_proj``    ``attn.qkv`` +
                     zeroing the keys' bias)                                                     ``q_bias``, ``v_bias``
attention output     ``blocks.N.attn.proj``                ``layer.N.attention.o_proj``          ``attn.proj``
layer scale          ``blocks.N.ls1.gamma``, ``ls2``       ``layer.N.layer_scale1.lambda1``, 2   ``ls1.gamma``, ``ls2``
MLP                  ``mlp.fc1``, ``fc2``                  ``mlp.up_proj``, ``down_proj``        ``mlp.fc1``, ``fc2``
SwiGLU               ``mlp.w1`` (gate), ``w2``, ``w3``     ``mlp.gate_proj``, ``up_proj``,       ``mlp.fc1_g``,
                                                           ``down_proj``                         ``fc1_x``, ``fc2``
final norm           ``norm``                              ``norm``                              ``norm``
===================  ====================================  ====================================  ====================

Both read the class token after the final norm (Hugging Face's ``pooler_output``, Meta's
``x_norm_clstoken``): vitlab's ``pool="cls"``. The LayerNorm eps is 1e-5 in the released models (Meta's
``layernormbf16``; Hugging Face's ``layer_norm_eps``). Meta's checkpoints store the RoPE periods, in bfloat16: they
are checked against the base they imply (``theta``) and rebuilt in float32, as timm and Hugging Face do.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from ..errors import CheckpointError
from ..models.config import IMAGENET_MEAN, IMAGENET_STD, ViTConfig
from .files import stated_fields

__all__ = [
    "HF_MODEL_TYPE",
    "from_hf",
    "from_meta",
    "hf_config",
    "hf_fields",
    "is_meta_state",
    "meta_fields",
    "to_hf",
    "to_meta",
    "unsupported",
]

HF_MODEL_TYPE = "dinov3_vit"
_DINOV3 = dict(rope=True, rope_kind="dinov3", posemb="none", class_token=True, pool="cls", fc_norm=False)
_HF_FIELDS = (
    ("embed_dim", "hidden_size"),
    ("depth", "num_hidden_layers"),
    ("num_heads", "num_attention_heads"),
    ("mlp_dim", "intermediate_size"),
    ("patch_size", "patch_size"),
    ("in_chans", "num_channels"),
    ("norm_eps", "layer_norm_eps"),
    ("img_size", "image_size"),
    ("rope_theta", "rope_theta"),
    ("reg_tokens", "num_register_tokens"),
)
"""(ViTConfig field, Hugging Face ``DINOv3ViTConfig`` key)."""


# -- Hugging Face ---------------------------------------------------------------------------------------------------
def hf_fields(raw: dict[str, Any], *, source: str) -> dict[str, Any]:
    """ViTConfig fields from a ``DINOv3ViTConfig`` ``config.json``, each checked; what vitlab does not compute
    (another activation, a pre-training-only option) is a :class:`CheckpointError` naming the key."""
    f: dict[str, Any] = dict(_DINOV3, num_classes=0, mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=1.0)
    f.update(rope_theta=100.0, norm_eps=1e-5)
    f.update(stated_fields(raw, _HF_FIELDS, source=source))
    gated = raw.get("use_gated_mlp", False)
    act = raw.get("hidden_act", "gelu")
    if gated is True and act == "silu":
        f["mlp"] = "swiglu"
    elif gated is False and act in ("gelu", "gelu_pytorch_tanh", "gelu_new"):
        f["act"] = "gelu" if act == "gelu" else "gelu_tanh"
    else:
        raise CheckpointError(
            f"{source}: use_gated_mlp {gated!r:.20} with hidden_act {act!r:.40}: vitlab has a GELU MLP or a SiLU-gated "
            "SwiGLU"
        )
    if not isinstance(raw.get("layerscale_value", 1.0), (int, float)):
        raise CheckpointError(f"{source}: layerscale_value: expected a number")
    f["init_values"] = float(raw.get("layerscale_value", 1.0))
    return f


def from_hf(state: dict[str, torch.Tensor], *, source: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Hugging Face's DINOv3 names -> vitlab's: ``(state, fields the tensors imply)``: the attention's biases
    (q/v only unless the keys have one), zero biases where Hugging Face's ``proj_bias``/``mlp_bias`` leave them out
    (the same function), and no ``reg_token`` for a model without registers."""
    out: dict[str, torch.Tensor] = {}
    attn: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    fields: dict[str, Any] = {}
    renames = [
        (r"embeddings\.cls_token", "cls_token"),
        (r"embeddings\.register_tokens", "reg_token"),
        (r"embeddings\.patch_embeddings\.(weight|bias)", r"patch_embed.proj.\1"),
        (r"layer\.(\d+)\.norm([12])\.(weight|bias)", r"blocks.\1.norm\2.\3"),
        (r"layer\.(\d+)\.attention\.o_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
        (r"layer\.(\d+)\.layer_scale([12])\.lambda1", r"blocks.\1.ls\2.gamma"),
        (r"norm\.(weight|bias)", r"norm.\1"),
    ]
    gated = any(re.search(r"mlp\.gate_proj\.", k) for k in state)
    mlp = (
        {"gate_proj": "fc1_g", "up_proj": "fc1_x", "down_proj": "fc2"}
        if gated
        else {"up_proj": "fc1", "down_proj": "fc2"}
    )
    for key, t in state.items():
        k = key[len("model.") :] if key.startswith("model.") else key
        if k == "embeddings.mask_token":
            continue  # masked image modelling only
        m = re.fullmatch(r"layer\.(\d+)\.attention\.([qkv])_proj\.(weight|bias)", k)
        if m:
            attn.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = t
            continue
        m = re.fullmatch(r"layer\.(\d+)\.mlp\.(\w+)\.(weight|bias)", k)
        if m and m.group(2) in mlp:
            out[f"blocks.{m.group(1)}.mlp.{mlp[m.group(2)]}.{m.group(3)}"] = t
            continue
        for pat, rep in renames:
            if re.fullmatch(pat, k):
                out[re.sub(pat, rep, k)] = t
                break
        else:
            out[key] = t  # unknown: reported as unexpected by the loader
    if "reg_token" in out and out["reg_token"].shape[1] == 0:
        del out["reg_token"]
    for (i, kind), parts in attn.items():
        if kind == "weight":
            if set(parts) != {"q", "k", "v"}:
                raise CheckpointError(f"{source}: layer {i}: the attention has only {', '.join(sorted(parts))}_proj")
            out[f"blocks.{i}.attn.qkv.weight"] = torch.cat([parts["q"], parts["k"], parts["v"]])
            continue
        zero = next(iter(parts.values())).new_zeros(next(iter(parts.values())).shape)
        if "k" in parts:  # a key bias too (key_bias: true): turned by RoPE, it is no constant
            out[f"blocks.{i}.attn.qkv.bias"] = torch.cat([parts.get(p, zero) for p in "qkv"])
        else:
            out[f"blocks.{i}.attn.q_bias"], out[f"blocks.{i}.attn.v_bias"] = parts.get("q", zero), parts.get("v", zero)
    depth = 1 + max((int(m.group(1)) for k in out if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1)
    _fill_zero_biases(out, depth)
    fields["qkv_bias"] = any(k.endswith(("attn.qkv.bias", "attn.q_bias")) for k in out)
    fields["key_bias"] = not any(k.endswith("attn.q_bias") for k in out)
    return out, fields


def _fill_zero_biases(state: dict[str, torch.Tensor], depth: int) -> None:
    """Zero biases for the output projection and the MLP where a checkpoint has none (Hugging Face's ``proj_bias``,
    ``mlp_bias`` false; Meta's ``proj_bias``, ``ffn_bias`` false): the same function in vitlab's layers."""
    for i in range(depth):
        for layer in ("attn.proj", "mlp.fc1", "mlp.fc1_g", "mlp.fc1_x", "mlp.fc2"):
            w = state.get(f"blocks.{i}.{layer}.weight")
            if w is not None and f"blocks.{i}.{layer}.bias" not in state:
                state[f"blocks.{i}.{layer}.bias"] = w.new_zeros(w.shape[0])


def unsupported(cfg: ViTConfig, layout: str) -> list[str]:
    """The options of ``cfg`` that DINOv3's model in ``layout`` (``hf`` or ``meta``) does not have."""
    bad = {
        "rope": not cfg.rope,  # (a model without RoPE keeps the default rope_kind: name what it lacks)
        "rope_kind": cfg.rope and cfg.rope_kind != "dinov3",
        "posemb": cfg.posemb != "none",
        "class_token": not cfg.class_token,
        "dist_token": cfg.dist_token,
        "qk_norm": cfg.qk_norm,
        "pre_norm": cfg.pre_norm,
        "attn_norm": cfg.attn_norm,
        "mlp_norm": cfg.mlp_norm,
        "act": cfg.mlp == "mlp" and cfg.act not in ("gelu", "gelu_tanh" if layout == "hf" else "gelu"),
        "fc_norm": cfg.fc_norm,
        "head": cfg.head != "linear",
        "num_classes": cfg.num_classes > 0,
        "stem": cfg.stem != "patch" or cfg.hybrid_layers is not None,
        "attention": cfg.attention != "global",
    }
    return [k for k, v in bad.items() if v]


def hf_config(cfg: ViTConfig) -> dict[str, Any]:
    """The ``config.json`` of Hugging Face's ``DINOv3ViTModel`` for ``cfg``."""
    swiglu = cfg.mlp == "swiglu"
    return {
        "architectures": ["DINOv3ViTModel"],
        "model_type": HF_MODEL_TYPE,
        "hidden_size": cfg.embed_dim,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "hidden_act": "silu" if swiglu else {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}[cfg.act],
        "use_gated_mlp": swiglu,
        "layer_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "image_size": cfg.img_size[0] if cfg.img_size[0] == cfg.img_size[1] else list(cfg.img_size),
        "patch_size": cfg.patch_size,
        "num_channels": cfg.in_chans,
        "query_bias": cfg.qkv_bias,
        "key_bias": cfg.qkv_bias and cfg.key_bias,
        "value_bias": cfg.qkv_bias,
        "proj_bias": True,
        "mlp_bias": True,
        "layerscale_value": cfg.init_values if cfg.init_values is not None else 1.0,
        "num_register_tokens": cfg.reg_tokens,
        "drop_path_rate": 0.0,
    }


def to_hf(state: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab's names -> those of Hugging Face's ``DINOv3ViTModel`` (what ``save_pretrained`` writes); a model
    without layer scale gets scales of 1 and one without registers an empty ``register_tokens`` (the same
    function), and the pre-training's ``mask_token`` is zero."""
    d = cfg.embed_dim
    ref = state["patch_embed.proj.weight"]
    out = {
        "embeddings.cls_token": state["cls_token"],
        "embeddings.mask_token": ref.new_zeros(1, 1, d),
        "embeddings.register_tokens": state.get("reg_token", ref.new_zeros(1, 0, d)),
        "embeddings.patch_embeddings.weight": ref,
        "embeddings.patch_embeddings.bias": state["patch_embed.proj.bias"],
        "norm.weight": state["norm.weight"],
        "norm.bias": state["norm.bias"],
    }
    mlp = {"fc1_g": "gate_proj", "fc1_x": "up_proj", "fc2": "down_proj"} if cfg.mlp == "swiglu" else {}
    mlp = mlp or {"fc1": "up_proj", "fc2": "down_proj"}
    for i in range(cfg.depth):
        b, h = f"blocks.{i}.", f"layer.{i}."
        for n in ("norm1", "norm2"):
            out[f"{h}{n}.weight"], out[f"{h}{n}.bias"] = state[f"{b}{n}.weight"], state[f"{b}{n}.bias"]
        for part, w in zip("qkv", state[b + "attn.qkv.weight"].chunk(3)):
            out[f"{h}attention.{part}_proj.weight"] = w
        if b + "attn.qkv.bias" in state:
            for part, v in zip("qkv", state[b + "attn.qkv.bias"].chunk(3)):
                out[f"{h}attention.{part}_proj.bias"] = v
        elif b + "attn.q_bias" in state:
            out[h + "attention.q_proj.bias"], out[h + "attention.v_proj.bias"] = (
                state[b + "attn.q_bias"],
                state[b + "attn.v_bias"],
            )
        out[h + "attention.o_proj.weight"], out[h + "attention.o_proj.bias"] = (
            state[b + "attn.proj.weight"],
            state[b + "attn.proj.bias"],
        )
        for j in (1, 2):
            out[f"{h}layer_scale{j}.lambda1"] = state.get(f"{b}ls{j}.gamma", ref.new_ones(d))
        for ours, theirs in mlp.items():
            out[f"{h}mlp.{theirs}.weight"], out[f"{h}mlp.{theirs}.bias"] = (
                state[f"{b}mlp.{ours}.weight"],
                state[f"{b}mlp.{ours}.bias"],
            )
    return out


# -- Meta -----------------------------------------------------------------------------------------------------------
def is_meta_state(state: dict[str, torch.Tensor]) -> bool:
    """Meta's DINOv3 layout: its registers are ``storage_tokens``, or its RoPE periods are stored."""
    return "storage_tokens" in state or any(k.startswith("rope_embed.") for k in state)


def from_meta(state: dict[str, torch.Tensor], *, source: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Meta's DINOv3 names -> vitlab's: ``(state, fields)``. The keys' masked bias (``qkv.bias_mask``) is applied, so
    that only the queries' and values' biases stay when the mask zeroes the keys' third; the stored RoPE periods
    give the head count and the base, and are checked to be the ``base**(k/n)`` schedule (not the min/max-period
    one); an untied class-token norm (``cls_norm``) is refused, the pre-training's ``local_cls_norm`` dropped."""
    if "cls_norm.weight" in state:
        raise CheckpointError(
            f"{source}: cls_norm: an untied LayerNorm for the class and register tokens "
            "(untie_cls_and_patch_norms); vitlab has one final norm, so it is not loaded"
        )
    out: dict[str, torch.Tensor] = {}
    fields: dict[str, Any] = dict(_DINOV3, num_classes=0, mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=1.0)
    fields["norm_eps"] = 1e-5
    masks = {k[: -len(".bias_mask")]: v for k, v in state.items() if k.endswith(".bias_mask")}
    d = int(state["patch_embed.proj.weight"].shape[0]) if "patch_embed.proj.weight" in state else 0
    for k, t in state.items():
        if k in ("mask_token",) or k.endswith(".bias_mask") or k.startswith("local_cls_norm."):
            continue
        if k == "rope_embed.periods":
            fields.update(_periods_fields(t, d, source))
            continue
        if k == "storage_tokens":
            if t.shape[1]:
                out["reg_token"] = t
            continue
        m = re.fullmatch(r"(blocks\.\d+\.)attn\.qkv\.bias", k)
        if m:
            bias = t * masks[m.group(1) + "attn.qkv"].to(t.dtype) if m.group(1) + "attn.qkv" in masks else t
            q, kb, v = bias.chunk(3)
            if torch.count_nonzero(kb) == 0:
                out[m.group(1) + "attn.q_bias"], out[m.group(1) + "attn.v_bias"] = q, v
            else:
                out[k] = bias
            continue
        m = re.fullmatch(r"(blocks\.\d+\.mlp\.)w([123])\.(weight|bias)", k)
        if m:
            out[f"{m.group(1)}{ {'1': 'fc1_g', '2': 'fc1_x', '3': 'fc2'}[m.group(2)] }.{m.group(3)}"] = t
            continue
        out[k] = t
    depth = 1 + max((int(m.group(1)) for k in out if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1)
    _fill_zero_biases(out, depth)
    fields["qkv_bias"] = any(k.endswith(("attn.qkv.bias", "attn.q_bias")) for k in out)
    fields["key_bias"] = not any(k.endswith("attn.q_bias") for k in out)
    fields["reg_tokens"] = int(out["reg_token"].shape[1]) if "reg_token" in out else 0
    return out, fields


def _periods_fields(periods: torch.Tensor, width: int, source: str) -> dict[str, Any]:
    """``num_heads`` and ``rope_theta`` from Meta's stored periods ``base**(k/n)``, ``k < n = head_dim / 4`` (kept in
    bfloat16 by Meta: the check allows its rounding)."""
    p = periods.double().flatten()
    n = p.numel()
    if n == 0 or width % (4 * n) or n < 2 or not torch.all(p > 0):
        raise CheckpointError(f"{source}: rope_embed.periods: {n} periods do not fit the width {width}")
    theta = float(p[1] ** n)
    want = theta ** (torch.arange(n, dtype=torch.float64) / n)
    if not torch.allclose(p, want, rtol=1e-2):
        raise CheckpointError(
            f"{source}: rope_embed.periods are not base**(k/n) for any base (a min/max-period RoPE); "
            "vitlab computes DINOv3's base schedule only"
        )
    for nice in (100.0, 1000.0, 10000.0):  # bfloat16 rounds the base: take the round value it was
        if math.isclose(theta, nice, rel_tol=2e-2):
            theta = nice
    return {"num_heads": width // (4 * n), "rope_theta": theta}


def meta_fields(cfg: ViTConfig) -> dict[str, Any]:
    """Meta's ``DinoVisionTransformer`` keyword arguments for ``cfg`` (what its loader must be built with)."""
    swiglu = cfg.mlp == "swiglu"
    return {
        "img_size": cfg.img_size[0],
        "patch_size": cfg.patch_size,
        "in_chans": cfg.in_chans,
        "pos_embed_rope_base": cfg.rope_theta,
        "pos_embed_rope_dtype": "fp32",
        "embed_dim": cfg.embed_dim,
        "depth": cfg.depth,
        "num_heads": cfg.num_heads,
        "ffn_ratio": cfg.mlp_dim / cfg.embed_dim * (1.5 if swiglu else 1.0),
        "qkv_bias": cfg.qkv_bias,
        "layerscale_init": cfg.init_values,
        "norm_layer": "layernormbf16" if cfg.norm_eps == 1e-5 else "layernorm",
        "ffn_layer": "swiglu" if swiglu else "mlp",
        "n_storage_tokens": cfg.reg_tokens,
        "mask_k_bias": cfg.qkv_bias and not cfg.key_bias,
    }


def to_meta(state: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab's names -> Meta's (``DinoVisionTransformer``), the reverse of :func:`from_meta`: q/v-only biases become
    ``qkv.bias`` with a ``bias_mask`` zeroing the keys' third, SwiGLU's layers ``w1``/``w2``/``w3``, the registers
    ``storage_tokens``; the RoPE periods are written in float32 and the pre-training's ``mask_token`` as zeros."""
    d, n = cfg.embed_dim, cfg.embed_dim // cfg.num_heads // 4
    ref = state["patch_embed.proj.weight"]
    out: dict[str, torch.Tensor] = {}
    for k, t in state.items():
        m = re.fullmatch(r"(blocks\.\d+\.attn\.)(q_bias|v_bias)", k)
        if m:
            if m.group(2) == "q_bias":
                v = state[m.group(1) + "v_bias"]
                out[m.group(1) + "qkv.bias"] = torch.cat([t, torch.zeros_like(t), v])
                out[m.group(1) + "qkv.bias_mask"] = torch.cat(
                    [torch.ones_like(t), torch.zeros_like(t), torch.ones_like(t)]
                )
            continue
        m = re.fullmatch(r"(blocks\.\d+\.mlp\.)(fc1_g|fc1_x|fc2)\.(weight|bias)", k)
        if m and cfg.mlp == "swiglu":
            out[f"{m.group(1)}{ {'fc1_g': 'w1', 'fc1_x': 'w2', 'fc2': 'w3'}[m.group(2)] }.{m.group(3)}"] = t
            continue
        out["storage_tokens" if k == "reg_token" else k] = t
    out["mask_token"] = ref.new_zeros(1, d)
    out["rope_embed.periods"] = cfg.rope_theta ** (torch.arange(n, dtype=torch.float32) / n)
    return out

"""The backbone families whose state dicts do not say everything: told apart by their keys, renamed to vitlab's,
and completed with what the weights cannot show (RoPE's convention, LayerNorm eps, the pooling's heads).

timm keeps EVA-02, DINOv3, the Perception Encoder and the RoPE ViTs of timm and Naver in one class, ``Eva``, whose
state dicts share one naming (``blocks.N.gamma_1``, ``attn.q_bias``/``v_bias`` or ``attn.q_proj``/``k_proj``/
``v_proj``, a SwiGLU ``mlp.fc1`` packed as ``[gate; value]`` or split as ``mlp.fc1_g``/``fc1_x``) and none of
their RoPE: its tables are rebuilt, never stored. Each family is recognised by a signature of its keys
(:func:`identify`), and a checkpoint is loaded only when its signature is one vitlab computes exactly; a
recognised family vitlab does not compute, or an ``Eva`` checkpoint of no known family, is refused naming what is
missing (:class:`~vitlab.errors.CheckpointError`), never loaded as the nearest thing.

=========================  =================================================================  ================
family                     signature (timm's keys)                                            implied
=========================  =================================================================  ================
EVA-02                     class token, ``pos_embed``, q/v biases or split q/k/v, SwiGLU,     RoPE ``eva``,
                           no layer scale                                                     16x16 grid
DINOv3                     class token, registers, layer scale, no ``pos_embed``, final norm  RoPE ``dinov3``
Perception Encoder (core)  ``norm_pre`` and ``attn_pool``                                     RoPE ``pe``
timm's RoPE ViTs (SBB)     registers, layer scale, no class token or ``pos_embed``, fc_norm   RoPE ``eva``
RoPE-ViT (Naver, axial)    ``gamma_1``, full ``qkv`` bias, class token, no registers          RoPE ``pe``
DINOv2 giant (SwiGLU)      ``ls1.gamma``, class token, ``pos_embed``, packed SwiGLU           24 heads
=========================  =================================================================  ================

A timm Hub ``config.json`` naming the architecture (:func:`architecture_fields`) states these fields exactly and
takes precedence over the signature.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import CheckpointError
from ..models.config import ViTConfig
from ..models.variants import BACKBONES

__all__ = [
    "Family",
    "architecture_fields",
    "backbone_name",
    "from_eva",
    "from_naflex",
    "identify",
    "is_eva_state",
    "is_naflex_state",
    "timm_layout",
    "to_eva",
    "to_naflex",
]

_B0 = "blocks.0."

_INVISIBLE = (
    "rope",
    "rope_kind",
    "rope_theta",
    "rope_ref_grid",
    "rope_offset",
    "norm_eps",
    "act",
    "pool_include_prefix",
    "map_heads",
    "mean",
    "std",
    "crop_pct",
)
"""The fields a timm architecture name states that its weights cannot show."""

_NORM = ("mean", "std")
"""The input normalisation a family's weights were trained with (the weights cannot show it either)."""
_PE_REF_GRID = {192: 24, 384: 24, 768: 14, 1024: 24, 1536: 32}
"""The Perception Encoder's RoPE reference grid by width (timm's ``ref_feat_shape`` of the PE core names)."""


@dataclass(frozen=True)
class Family:
    """A recognised family: its name in words and the :class:`~vitlab.models.ViTConfig` fields it implies."""

    name: str
    fields: dict[str, Any] = field(default_factory=dict)


def _packed_glu(state: dict[str, torch.Tensor], prefix: str) -> bool:
    """Whether ``prefix``'s MLP is timm's ``GluMlp``/``SwiGLUPacked``: ``fc1`` twice as wide as ``fc2`` reads."""
    fc1, fc2 = state.get(prefix + "mlp.fc1.weight"), state.get(prefix + "mlp.fc2.weight")
    return fc1 is not None and fc2 is not None and fc1.ndim == 2 and fc2.ndim == 2 and fc1.shape[0] == 2 * fc2.shape[1]


def is_eva_state(state: dict[str, torch.Tensor]) -> bool:
    """Whether ``state`` has any of the names or shapes of timm's ``Eva`` class (or a SwiGLU MLP)."""
    keys = (
        "gamma_1",
        "attn.q_bias",
        "attn.q_proj.weight",
        "attn.norm.weight",
        "mlp.fc1_g.weight",
        "mlp.norm.weight",
    )
    return (
        any(_B0 + k in state for k in keys)
        or _packed_glu(state, _B0)
        or any(k.startswith("rope.") for k in state)
        or ("norm_pre.weight" in state and "attn_pool.latent" in state)
    )


def _width(state: dict[str, torch.Tensor]) -> int:
    w = state.get("patch_embed.proj.weight")
    return int(w.shape[0]) if w is not None and w.ndim == 4 else 0


def _registers(state: dict[str, torch.Tensor]) -> int:
    reg = state.get("reg_token")
    return int(reg.shape[1]) if reg is not None and reg.ndim == 3 else 0


def identify(
    state: dict[str, torch.Tensor], *, source: str = "checkpoint", stated: Collection[str] = ()
) -> Family | None:
    """The family of a timm-named state dict (before :func:`from_eva`), None for a plain ViT (timm's
    ``VisionTransformer``: what vitlab infers from shapes alone), or a :class:`CheckpointError` for a recognised
    family vitlab does not compute or an ``Eva`` checkpoint of no known family. ``stated``: the fields a config
    file states (no warning about guessing them)."""
    has = state.__contains__
    d = _width(state)
    cls, pos, reg = has("cls_token"), has("pos_embed"), _registers(state)
    ls = has(_B0 + "gamma_1") or has(_B0 + "ls1.gamma")
    eva_attn = has(_B0 + "attn.q_bias") or has(_B0 + "attn.q_proj.weight")
    swiglu = _packed_glu(state, _B0) or has(_B0 + "mlp.fc1_g.weight")
    final_norm, fc_norm = has("norm.weight"), has("fc_norm.weight")

    def refuse(what: str) -> CheckpointError:
        return CheckpointError(f"{source}: {what}; vitlab does not compute it exactly, so it is not loaded")

    if has("norm_pre.weight") and not final_norm and not fc_norm:
        raise refuse("a Perception Encoder spatial or language tower (pre-norm, no final LayerNorm)")
    if not is_eva_state(state):
        if has("attn_pool.latent") and not cls and d in (1152, 1536):  # SigLIP (2) So400m and giant-opt
            return Family("SigLIP", {"num_heads": 16})
        return None
    if any(k.startswith("rope.") for k in state):
        raise refuse("learned RoPE frequencies (RoPE-Mixed, Heo et al. 2024: timm's vit_*_rope_mixed_*)")
    if has("norm_pre.weight") and has("attn_pool.latent"):
        if ls or eva_attn or swiglu:
            raise refuse("a Perception Encoder tower with options beyond PE core's (layer scale, q/v biases, SwiGLU)")
        ref = _PE_REF_GRID.get(d) if cls else 32  # (no class token: PE core G, on a 32x32 grid)
        if ref is None:
            ref = 24
            if "rope_ref_grid" not in stated:
                warnings.warn(
                    f"{source}: a Perception Encoder of width {d}, not one of PE core's; assuming RoPE on the "
                    "24x24 grid of PE core T/S/L (pass rope_ref_grid=(rows, cols) if it was trained on another)",
                    stacklevel=4,
                )
        fields: dict[str, Any] = dict(BACKBONES["vit_pe_core_tiny_patch16_384"])
        fields = {k: fields[k] for k in ("rope", "rope_kind", "rope_theta", "norm_eps", "pool_include_prefix", *_NORM)}
        fields.update(map_heads=8, rope_ref_grid=(ref, ref), rope_offset=1.0 if cls else 0.0)
        if d == 1536:
            fields["num_heads"] = 16
        return Family("Perception Encoder (PE core)", fields)
    if cls and reg and ls and not pos and final_norm and not fc_norm:
        dinov3 = BACKBONES["vit_small_patch16_dinov3"]
        fields = {k: dinov3[k] for k in ("rope", "rope_kind", "rope_theta", "norm_eps", *_NORM)}
        fields.update(posemb="none", pool="gap", fc_norm=False)  # timm's default pooling for its DINOv3 names
        heads = {1280: 20, 4096: 32}.get(d)
        if heads:
            fields["num_heads"] = heads
        return Family("DINOv3", fields)
    if not cls and reg and ls and not pos and fc_norm and not swiglu:
        eva = dict(rope=True, rope_kind="eva", rope_theta=10000.0, rope_ref_grid=(16, 16), posemb="none")
        return Family("timm's RoPE ViT (SBB)", eva)
    if has(_B0 + "gamma_1") and cls and not reg and has(_B0 + "attn.qkv.bias") and final_norm and not swiglu:
        naver = dict(rope=True, rope_kind="pe", rope_theta=100.0, pool="cls")
        if not pos:
            naver["posemb"] = "none"
        return Family("RoPE-ViT (Naver, axial)", naver)
    if cls and pos and not ls and eva_attn and swiglu:
        eva02 = BACKBONES["eva02_tiny_patch14_224"]
        return Family("EVA-02", {k: eva02[k] for k in (*_INVISIBLE[:5], *_NORM) if k in eva02})
    if cls and pos and not ls and eva_attn and not swiglu:
        raise refuse(
            "an EVA-01 or EVA-02-E checkpoint (q/v biases, a GELU MLP): EVA-02-E's post-norm blocks have the same "
            "keys as EVA-01's pre-norm ones"
        )
    if has(_B0 + "ls1.gamma") and cls and pos and _packed_glu(state, _B0) and not eva_attn:
        return Family("DINOv2 (SwiGLU)", {"num_heads": 24} if d == 1536 else {})
    raise refuse(
        "a checkpoint in the layout of timm's Eva class (EVA, DINOv3, Perception Encoder, RoPE ViTs) of no family "
        "vitlab recognises"
    )


def is_naflex_state(state: dict[str, torch.Tensor]) -> bool:
    """timm's ``NaFlexVit`` (NaViT + FlexiViT; SigLIP 2's NaFlex towers): a linear patch embedding of flattened
    patches and a 2-D table of position embeddings, under ``embeds.``."""
    return "embeds.proj.weight" in state and "embeds.pos_embed" in state


def from_naflex(state: dict[str, torch.Tensor], *, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """``NaFlexVit``'s embedding -> timm's ``VisionTransformer`` names: the linear projection of each patch
    flattened as (row, column, channel) is the convolution ``patch_embed.proj`` of Eq. 1 (weights reordered to
    ``(D, C, P, P)``), the ``(1, rows, cols, D)`` table a ``pos_embed`` of ``rows x cols`` rows."""
    out = {k: v for k, v in state.items() if not k.startswith("embeds.")}
    w, pe = state["embeds.proj.weight"], state["embeds.pos_embed"]
    k = int(w.shape[1]) if w.ndim == 2 else 0
    p = math.isqrt(k // 3) if k % 3 == 0 else 0
    if not p or 3 * p * p != k or pe.ndim != 4:
        raise CheckpointError(f"{source}: embeds.proj.weight {tuple(w.shape)}: not 3-channel square patches")
    out["patch_embed.proj.weight"] = w.reshape(w.shape[0], p, p, 3).permute(0, 3, 1, 2).contiguous()
    if "embeds.proj.bias" in state:
        out["patch_embed.proj.bias"] = state["embeds.proj.bias"]
    out["pos_embed"] = pe.reshape(1, pe.shape[1] * pe.shape[2], pe.shape[3])
    other = sorted(set(state) - {"embeds.proj.weight", "embeds.proj.bias", "embeds.pos_embed"} - set(out))
    if other or "attn_pool.latent" not in state:
        what = ", ".join(other) if other else "no attention pooling"
        raise CheckpointError(
            f"{source}: a NaFlexViT other than SigLIP 2's ({what}); vitlab loads SigLIP 2's NaFlex towers only"
        )
    return out


def to_naflex(state: dict[str, torch.Tensor], grid: tuple[int, int]) -> dict[str, torch.Tensor]:
    """vitlab's names -> ``NaFlexVit``'s, the reverse of :func:`from_naflex` (``grid``: the table's rows, cols)."""
    out = {k: v for k, v in state.items() if k not in ("patch_embed.proj.weight", "patch_embed.proj.bias", "pos_embed")}
    w = state["patch_embed.proj.weight"]
    out["embeds.proj.weight"] = w.permute(0, 2, 3, 1).reshape(w.shape[0], -1).contiguous()
    out["embeds.proj.bias"] = state["patch_embed.proj.bias"]
    out["embeds.pos_embed"] = state["pos_embed"].reshape(1, grid[0], grid[1], -1).contiguous()
    return out


NAFLEX = dict(act="gelu_tanh", posemb_resample="bilinear", dynamic_img_pad=True)
"""What SigLIP 2's NaFlex towers compute that their keys cannot show: tanh-GELU, the position table resampled
bilinearly (antialiased) to each image's grid, images padded to whole patches (timm's ``naflexvit_*_siglip``)."""


def from_eva(state: dict[str, torch.Tensor], *, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """timm's ``Eva`` names -> vitlab's: ``gamma_1``/``gamma_2`` -> ``ls1.gamma``/``ls2.gamma``; split
    ``q_proj``/``k_proj``/``v_proj`` -> one ``qkv`` (with ``q_bias``/``v_bias``, or a full ``qkv.bias`` when the
    keys have one); a packed SwiGLU ``fc1`` ``[gate; value]`` -> ``fc1_g`` and ``fc1_x``. Other names are vitlab's
    already."""
    out: dict[str, torch.Tensor] = {}
    split: dict[str, dict[str, torch.Tensor]] = {}
    for k, t in state.items():
        m = re.fullmatch(r"(blocks\.\d+\.)gamma_([12])", k)
        if m:
            out[f"{m.group(1)}ls{m.group(2)}.gamma"] = t
            continue
        m = re.fullmatch(r"(blocks\.\d+\.attn\.)([qkv])_proj\.(weight|bias)", k)
        if m:
            split.setdefault(m.group(1), {})[f"{m.group(2)}.{m.group(3)}"] = t
            continue
        m = re.fullmatch(r"(blocks\.\d+\.mlp\.)fc1\.(weight|bias)", k)
        if m and _packed_glu(state, m.group(1)[: -len("mlp.")]):
            gate, value = t.chunk(2, dim=0)  # timm's GluMlp(gate_last=False): act(first half) * second half
            out[f"{m.group(1)}fc1_g.{m.group(2)}"], out[f"{m.group(1)}fc1_x.{m.group(2)}"] = gate, value
            continue
        out[k] = t
    for prefix, parts in split.items():
        if not {"q.weight", "k.weight", "v.weight"} <= set(parts):
            raise CheckpointError(f"{source}: {prefix}q_proj/k_proj/v_proj: only {', '.join(sorted(parts))}")
        out[prefix + "qkv.weight"] = torch.cat([parts["q.weight"], parts["k.weight"], parts["v.weight"]])
        if "k.bias" in parts:
            out[prefix + "qkv.bias"] = torch.cat([parts["q.bias"], parts["k.bias"], parts["v.bias"]])
        else:
            for p in ("q", "v"):
                if f"{p}.bias" in parts:
                    out[f"{prefix}{p}_bias"] = parts[f"{p}.bias"]
    return out


def to_eva(
    state: dict[str, torch.Tensor], *, split_qkv: bool, packed_glu: bool, eva: bool = True
) -> dict[str, torch.Tensor]:
    """vitlab's names -> timm's ``Eva`` names, the reverse of :func:`from_eva`: ``split_qkv`` writes
    ``q_proj``/``k_proj``/``v_proj`` (EVA-02 B/L), ``packed_glu`` one ``fc1`` ``[gate; value]`` (EVA-02 T/S, and
    timm's ``VisionTransformer`` with ``SwiGLUPacked``: ``eva=False`` keeps the layer scales' ``ls1.gamma``)."""
    out: dict[str, torch.Tensor] = {}
    for k, t in state.items():
        m = re.fullmatch(r"(blocks\.\d+\.)ls([12])\.gamma", k)
        if m and eva:
            out[f"{m.group(1)}gamma_{m.group(2)}"] = t
            continue
        m = re.fullmatch(r"(blocks\.\d+\.attn\.)(qkv\.weight|qkv\.bias|q_bias|v_bias)", k)
        if m and split_qkv:
            p, what = m.groups()
            if what == "qkv.weight":
                for name, part in zip("qkv", t.chunk(3)):
                    out[f"{p}{name}_proj.weight"] = part
            elif what == "qkv.bias":
                for name, part in zip("qkv", t.chunk(3)):
                    out[f"{p}{name}_proj.bias"] = part
            else:
                out[f"{p}{what[0]}_proj.bias"] = t
            continue
        m = re.fullmatch(r"(blocks\.\d+\.mlp\.)fc1_g\.(weight|bias)", k)
        if m and packed_glu:
            out[f"{m.group(1)}fc1.{m.group(2)}"] = torch.cat([t, state[f"{m.group(1)}fc1_x.{m.group(2)}"]])
            continue
        if packed_glu and re.fullmatch(r"blocks\.\d+\.mlp\.fc1_x\.(weight|bias)", k):
            continue
        out[k] = t
    return out


def timm_layout(state: dict[str, torch.Tensor]) -> str:
    """How a timm state dict lays out what vitlab keeps one way (recorded in the config's ``extra``, so that
    the timm layout is written back the same, :mod:`.layouts`): ``split_qkv`` (q/k/v projections of their own),
    ``packed_glu`` (one SwiGLU ``fc1``), ``no_embed_class`` (no position embeddings for the prefix tokens), comma
    separated, or ""."""
    facts = []
    if _B0 + "attn.q_proj.weight" in state:
        facts.append("split_qkv")
    if _packed_glu(state, _B0):
        facts.append("packed_glu")
    pe = state.get("pos_embed")
    prefix = int("cls_token" in state) + int("dist_token" in state) + _registers(state)
    if pe is not None and pe.ndim == 3 and prefix:
        n = int(pe.shape[1])
        if math.isqrt(n) ** 2 == n and (n < prefix or math.isqrt(n - prefix) ** 2 != n - prefix):
            facts.append("no_embed_class")
    return ",".join(facts)


def architecture_fields(architecture: str, *, width: int | None = None) -> dict[str, Any]:
    """The fields a timm architecture name (a Hub ``config.json``'s ``architecture``) states that the weights
    cannot show, for the names of :data:`~vitlab.models.variants.BACKBONES` ({} for others); the head count
    too when the weights are of the name's ``width``."""
    fields = BACKBONES.get(architecture.split(".", 1)[0])
    if fields is None:
        return {}
    out = {k: fields[k] for k in _INVISIBLE if k in fields}
    if width == fields["embed_dim"]:
        out["num_heads"] = fields["num_heads"]
    return out


_OPTIONS = (
    "mlp",
    "qkv_bias",
    "key_bias",
    "rope",
    "rope_kind",
    "class_token",
    "posemb",
    "pre_norm",
    "attn_norm",
    "mlp_norm",
    "pool_include_prefix",
    "qk_norm",
    "dist_token",
    "act",
    "dynamic_img_pad",
)
"""What makes two configs the same architecture at other sizes (with registers and layer scale present or not)."""
_SIZES = ("embed_dim", "depth", "num_heads", "mlp_dim", "patch_size", "reg_tokens")


def _same_options(a: ViTConfig, b: ViTConfig, *, ignore: tuple[str, ...] = ()) -> bool:
    return (
        all(getattr(a, f) == getattr(b, f) for f in _OPTIONS if f not in ignore)
        and ("reg_tokens" in ignore or (a.reg_tokens > 0) == (b.reg_tokens > 0))
        and (a.init_values is None) == (b.init_values is None)
        and (not a.key_bias or not a.qkv_bias) == (not b.key_bias or not b.qkv_bias)
        and ("naflex" in str(a.extra.get("timm_layout", ""))) == ("naflex" in str(b.extra.get("timm_layout", "")))
    )


def backbone_name(cfg: ViTConfig, *, sizes: bool = True) -> str | None:
    """The name of :data:`~vitlab.models.variants.BACKBONES` whose architecture ``cfg`` is (at its sizes too, with
    ``sizes``; the nearest width first, then its own resolution), or None."""
    hits = []
    for name, fields in BACKBONES.items():
        ref = ViTConfig(**fields)
        if _same_options(ref, cfg) and (not sizes or all(getattr(ref, f) == getattr(cfg, f) for f in _SIZES)):
            hits.append((abs(ref.embed_dim - cfg.embed_dim), ref.img_size != cfg.img_size, name))
    return min(hits)[2] if hits else None

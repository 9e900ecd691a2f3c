"""The named model variants without torch: the paper's Table 1 and the sizes that followed it, the hybrids,
the axial ViTs and timm's names for them, as :class:`~vitlab.models.config.ViTConfig` fields.

``model_config("vit_b16")`` and ``model_config("B/16")`` are the same configuration. What builds a model from a
name is :mod:`vitlab.models.registry`; this table is what a run's options are checked against before torch is
imported (``vitlab train --model``, ``vitlab plan``).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from ..errors import UnknownModelError
from .config import IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, ViTConfig

__all__ = [
    "BACKBONES",
    "CCTS",
    "HYBRIDS",
    "NOT_IN_TIMM",
    "NO_EMBED_CLASS",
    "TIMM_ALIASES",
    "VARIANTS",
    "Variant",
    "add_name",
    "backbone_tag",
    "close_names",
    "list_models",
    "model_config",
    "resolve_name",
]


@dataclass(frozen=True)
class Variant:
    """One row of Table 1 (plus the later Ti, S and g sizes)."""

    width: int
    depth: int
    mlp_dim: int
    heads: int


VARIANTS: dict[str, Variant] = {
    "ti": Variant(192, 12, 768, 3),
    "s": Variant(384, 12, 1536, 6),
    "b": Variant(768, 12, 3072, 12),
    "l": Variant(1024, 24, 4096, 16),
    "h": Variant(1280, 32, 5120, 16),
    "g": Variant(1408, 40, 6144, 16),
}

# Width x patch combinations for which weights or published results exist.
_PATCHES: dict[str, tuple[int, ...]] = {
    "ti": (8, 16, 32),
    "s": (8, 14, 16, 32),
    "b": (8, 14, 16, 32),
    "l": (14, 16, 32),
    "h": (14, 16),
    "g": (14,),
}

# Hybrids (Sec. 3.1): name -> (transformer variant, ResNet stages, patch size on the feature map).
# "R+Ti/16" is the ResNet stem (stride 4) with 8x8 patches; the others use 1x1 patches of the ResNet's output.
HYBRIDS: dict[str, tuple[str, tuple[int, ...], int]] = {
    "vit_r_ti16": ("vit_ti16", (), 8),
    "vit_r26_s32": ("vit_s32", (2, 2, 2, 2), 1),
    "vit_r50_b16": ("vit_b16", (3, 4, 9), 1),
    "vit_r50_l32": ("vit_l32", (3, 4, 6, 3), 1),
}

# Compact Convolutional Transformers (Hassani et al. 2021, Table 1's CIFAR models): CCT-L/KxN is L blocks behind
# N convolutional tokenizer layers of kernel K (3 here; stem="conv"), sequence pooling, no class token, learned
# position embeddings, and no bias on the queries, keys and values (as CCT). Dropout and stochastic depth are the
# training recipe's.
_CCT = dict(stem="conv", patch_size=1, class_token=False, pool="seq", qkv_bias=False, posemb="learn")
CCTS: dict[str, dict[str, Any]] = {
    f"vit_cct{depth}_3x{n}": dict(_CCT, depth=depth, embed_dim=256, num_heads=4, mlp_dim=512, stem_layers=n)
    for depth in (6, 7)
    for n in (1, 2)
}


def model_config(name: str, /, **overrides: Any) -> ViTConfig:
    """The :class:`ViTConfig` of a registered ViT, hybrid, axial or CCT name such as ``vit_b16``, ``B/16``,
    ``vit_r50_b16``, ``axial_vit_b16`` or ``vit_cct7_3x1``, or of a timm name (:data:`TIMM_ALIASES`: our variant with
    the fields the name implies, as :func:`vitlab.create_model` builds it)."""
    alias = TIMM_ALIASES.get(name.strip().lower().split(".", 1)[0])
    if alias:  # a timm name: our variant with the fields the name implies (SigLIP's pooling, DINOv2's registers ...)
        return model_config(alias[0], **{**alias[1], **overrides})
    canon = resolve_name(name)
    axial = re.fullmatch(r"axial_(vit_b(?:16|32))", canon)
    if axial:  # Axial-ViT (Appendix D.6): ViT-B's sizes, each block attending along rows, then columns
        return model_config(axial.group(1), **{"name": canon, "attention": "axial", **overrides})
    if canon in CCTS:
        return ViTConfig(**{"name": canon, **CCTS[canon], **overrides})
    if canon in BACKBONES:
        return ViTConfig(**{"name": canon, **BACKBONES[canon], **overrides})
    if canon in HYBRIDS:
        base, layers, patch = HYBRIDS[canon]
        return model_config(base, **{"name": canon, "hybrid_layers": layers, "patch_size": patch, **overrides})
    m = re.fullmatch(r"vit_([a-z]+)(\d+)", canon)
    if not m or m.group(1) not in VARIANTS:
        raise UnknownModelError(f"{name!r} is not a plain ViT name")
    v = VARIANTS[m.group(1)]
    base = dict(
        name=canon, patch_size=int(m.group(2)), embed_dim=v.width, depth=v.depth, mlp_dim=v.mlp_dim, num_heads=v.heads
    )
    return ViTConfig(**{**base, **overrides})


_NAMES: set[str] = {
    *(f"vit_{v}{p}" for v, ps in _PATCHES.items() for p in ps),
    *HYBRIDS,
    *CCTS,
    *(f"axial_vit_b{p}" for p in (16, 32)),  # Axial-ViT (Appendix D.6)
}
"""Every registered name: the built-in ones, and those :func:`vitlab.models.registry.register` adds."""


def add_name(name: str) -> None:
    """Count ``name`` as registered (:func:`vitlab.models.registry.register` calls it)."""
    _NAMES.add(name)


def list_models() -> list[str]:
    """All registered names."""
    return sorted(_NAMES, key=lambda n: (_order(n), n))


def _order(name: str) -> tuple[int, int]:
    m = re.fullmatch(r"(?:[a-z0-9]+_)*?([a-z]+)(\d+)", name.split("_", 1)[-1])
    keys = list(VARIANTS)
    if name.startswith("axial_"):
        return len(keys) + 2, int(name[len("axial_vit_b") :])
    if name in HYBRIDS:
        return len(keys) + 1, keys.index(HYBRIDS[name][0].split("_")[1].rstrip("0123456789"))
    if name in CCTS:
        return len(keys) + 1, len(keys)
    if m and m.group(1) in keys:
        return keys.index(m.group(1)), int(m.group(2))
    return len(keys), 0


def resolve_name(name: str) -> str:
    """Canonical name: ``"B/16"``, ``"ViT-B/16"`` and ``"vit_b16"`` all give ``"vit_b16"``; timm's
    names give ours (``"vit_base_patch16_224"`` -> ``"vit_b16"``, see :data:`TIMM_ALIASES`)."""
    n = name.strip()
    m = re.fullmatch(r"(?i)(?:vit[-_])?(ti|s|b|l|h|g)/(\d+)", n)
    if m:
        return f"vit_{m.group(1).lower()}{m.group(2)}"
    base = n.lower().split(".", 1)[0]  # (a timm name may carry its weights' ".tag")
    alias = TIMM_ALIASES.get(base)
    if alias:
        return alias[0]
    return base if base in BACKBONES else n.lower()


def close_names(name: str, *, also: tuple[str, ...] = ()) -> list[str]:
    """Up to three registered names (and of ``also``) close to ``name``, closest first."""
    return difflib.get_close_matches(resolve_name(name).split(".", 1)[0], [*list_models(), *also], n=3, cutoff=0.5)


CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_TIMM_SIZES = {"tiny": "ti", "small": "s", "base": "b", "large": "l", "huge": "h", "giant": "g"}


def _timm_aliases() -> dict[str, tuple[str, dict[str, Any]]]:
    """timm's architecture names -> (our name, the config fields the timm name implies). DeiT
    (Touvron et al. 2021) is the same architecture trained with ImageNet's normalisation. ``crop_pct``
    is that of the name's default weights in timm (0.9 at 224 px, 1.0 above, with exceptions noted)."""
    table: dict[str, tuple[str, dict[str, Any]]] = {}
    for size, ours in _TIMM_SIZES.items():
        for patch in _PATCHES[ours]:
            for res in (224, 384):
                crop = {"crop_pct": 0.9 if res == 224 else 1.0}
                table[f"vit_{size}_patch{patch}_{res}"] = (f"vit_{ours}{patch}", {"img_size": res, **crop})
    for size in ("tiny", "small", "base"):
        for res in (224, 384) if size == "base" else (224,):
            fields = {
                "img_size": res,
                "mean": IMAGENET_MEAN,
                "std": IMAGENET_STD,
                "crop_pct": 0.9 if res == 224 else 1.0,
            }
            table[f"deit_{size}_patch16_{res}"] = (f"vit_{_TIMM_SIZES[size]}16", fields)
            table[f"deit_{size}_distilled_patch16_{res}"] = (
                f"vit_{_TIMM_SIZES[size]}16",
                {**fields, "dist_token": True},
            )
    # DINOv2 (Oquab et al. 2023): layer scale; "_reg4" adds 4 registers (Darcet et al. 2024)
    for size in ("small", "base", "large"):
        fields = {"img_size": 518, "init_values": 1e-5, "num_classes": 0, "mean": IMAGENET_MEAN, "std": IMAGENET_STD}
        fields["crop_pct"] = 1.0
        table[f"vit_{size}_patch14_dinov2"] = (f"vit_{_TIMM_SIZES[size]}14", fields)
        table[f"vit_{size}_patch14_reg4_dinov2"] = (f"vit_{_TIMM_SIZES[size]}14", {**fields, "reg_tokens": 4})
    # CLIP (Radford et al. 2021) image towers: pre-norm, LayerNorm eps 1e-5; OpenAI's weights use QuickGELU
    # (OpenAI's "head" is the projection into the joint image-text space, 512 or 768 wide, as timm's defaults)
    # (timm's default CLIP weights are cropped at 0.9 for B/32, 0.95 for B/16, 1.0 for the QuickGELU B/16 and L, H)
    for size, patches, proj in (("base", (32, 16), 512), ("large", (14,), 768), ("huge", (14,), 1024)):
        for patch in patches:
            crop = {32: 0.9, 16: 0.95}.get(patch, 1.0)
            fields = {"pre_norm": True, "norm_eps": 1e-5, "mean": CLIP_MEAN, "std": CLIP_STD, "crop_pct": crop}
            ours = f"vit_{_TIMM_SIZES[size]}{patch}"
            table[f"vit_{size}_patch{patch}_clip_224"] = (ours, fields)
            quick = {**fields, "act": "quick_gelu", "num_classes": proj, "crop_pct": 0.9 if patch == 32 else 1.0}
            table[f"vit_{size}_patch{patch}_clip_quickgelu_224"] = (ours, quick)
    # SigLIP (Zhai et al. 2023) image towers: no class token, attention pooling
    # (SigLIP 2's towers of these shapes are the same architectures, timm's ".v2_webli" weights; "_gap": the mean
    # of the patch tokens instead of attention pooling)
    for size, patch, resolutions in (("base", 16, (224, 256, 384, 512)), ("large", 16, (256, 384, 512))):
        for res in resolutions:
            fields = {"img_size": res, "class_token": False, "pool": "map", "num_classes": 0, "crop_pct": 0.9}
            table[f"vit_{size}_patch{patch}_siglip_{res}"] = (f"vit_{_TIMM_SIZES[size]}{patch}", fields)
            table[f"vit_{size}_patch{patch}_siglip_gap_{res}"] = (
                f"vit_{_TIMM_SIZES[size]}{patch}",
                {**fields, "pool": "gap"},
            )
    fields = {"img_size": 256, "class_token": False, "pool": "map", "num_classes": 0, "crop_pct": 0.9}
    table["vit_base_patch32_siglip_256"] = ("vit_b32", fields)
    table["vit_base_patch32_siglip_gap_256"] = ("vit_b32", {**fields, "pool": "gap"})
    return table


TIMM_ALIASES: dict[str, tuple[str, dict[str, Any]]] = _timm_aliases()

NOT_IN_TIMM = frozenset(
    {
        *(f"vit_tiny_patch{p}_{r}" for p in (8, 32) for r in (224, 384)),
        *(f"vit_small_patch14_{r}" for r in (224, 384)),
        *(f"vit_base_patch14_{r}" for r in (224, 384)),
        *(f"vit_huge_patch16_{r}" for r in (224, 384)),
        "vit_small_patch8_384",
        "vit_base_patch8_384",
        "vit_large_patch14_384",
        "vit_huge_patch14_384",
        "vit_giant_patch14_384",
    }
)
"""The names of :data:`TIMM_ALIASES` made by timm's pattern that timm itself does not register (no Ti/8 or Ti/32, no
384 px S/8 ...): vitlab takes them as its own names, and never writes one as the architecture of a timm layout."""

NO_EMBED_CLASS = frozenset(f"vit_{size}_patch14_reg4_dinov2" for size in ("small", "base", "large"))
"""The names of :data:`TIMM_ALIASES` whose timm model has no position rows for the class and register tokens
(``no_embed_class``): a table written as one of them leaves those rows out, added to the tokens instead."""
"""timm's names that ``create_model`` accepts (with or without a ``.pretrained_tag``)."""


def _backbones() -> dict[str, dict[str, Any]]:
    """The backbones fine-tuned today, by timm's names, as complete :class:`ViTConfig` fields (their
    architecture is not one of Table 1's, so each is a registered model of its own, listed with its parameter
    count). ``num_classes``, ``img_size``, normalisation and ``crop_pct`` are those of timm's default weights
    for the name; the options are cited where :class:`ViTConfig` defines them."""
    table: dict[str, dict[str, Any]] = {}
    # EVA-02 (Fang et al. 2023): SwiGLU MLP (NormFormer's hidden norm in B/L), q/v biases, learned absolute
    # position embeddings *and* RoPE on a 16x16 reference grid (224 px / 14); MIM towers pool the patch tokens
    # (fc_norm), the EVA-CLIP towers read the class token (and normalise the attention's output too).
    eva02 = dict(mlp="swiglu", key_bias=False, rope=True, rope_kind="eva", rope_theta=10000.0, rope_ref_grid=(16, 16))
    eva02.update(mean=CLIP_MEAN, std=CLIP_STD, patch_size=14)
    sizes = {"tiny": (192, 12, 3, 512), "small": (384, 12, 6, 1024), "base": (768, 12, 12, 2048)}
    sizes["large"] = (1024, 24, 16, 2730)
    for size, (d, depth, heads, mlp) in sizes.items():
        dims = dict(eva02, embed_dim=d, depth=depth, num_heads=heads, mlp_dim=mlp, mlp_norm=d >= 768)
        for res in (224, 336) if d < 768 else (224, 448):
            fine_tuned = res != 224  # timm's default weights at 336/448 px are ImageNet-1k classifiers
            table[f"eva02_{size}_patch14_{res}"] = dict(
                dims, img_size=res, pool="gap", fc_norm=True, num_classes=1000 if fine_tuned else 0,
                crop_pct=1.0 if fine_tuned else 0.9,
            )  # fmt: skip
    clip = dict(attn_norm=True, pool="cls")
    table["eva02_base_patch16_clip_224"] = dict(
        eva02, **clip, embed_dim=768, depth=12, num_heads=12, mlp_dim=2048, mlp_norm=True, patch_size=16,
        img_size=224, num_classes=512, crop_pct=0.9,
    )  # fmt: skip
    for res in (224, 336):
        table[f"eva02_large_patch14_clip_{res}"] = dict(
            eva02, **clip, embed_dim=1024, depth=24, num_heads=16, mlp_dim=2730, mlp_norm=True, img_size=res,
            num_classes=768, crop_pct=0.9 if res == 224 else 1.0,
        )  # fmt: skip
    # DINOv3 (Simeoni et al. 2025): no absolute table, RoPE on normalised patch centres, 4 registers, layer
    # scale, LayerNorm eps 1e-5; "_qkvb" keeps the q/v biases of Meta's release (the others had them all zero).
    # timm pools the patch tokens by default (global_pool="avg"); Meta and Hugging Face read the class token.
    dinov3 = dict(rope=True, rope_kind="dinov3", rope_theta=100.0, posemb="none", reg_tokens=4, init_values=1e-5)
    dinov3.update(norm_eps=1e-5, pool="gap", num_classes=0, img_size=256, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    dinov3.update(crop_pct=1.0, patch_size=16)
    for size, (d, depth, heads, mlp, swiglu, plain) in {
        "tiny": (192, 12, 3, 768, False, False),
        "small": (384, 12, 6, 1536, False, True),
        "small_plus": (384, 12, 6, 1536, True, True),
        "base": (768, 12, 12, 3072, False, True),
        "large": (1024, 24, 16, 4096, False, True),
        "huge_plus": (1280, 32, 20, 5120, True, True),
        "7b": (4096, 40, 32, 8192, True, True),
    }.items():
        dims = dict(dinov3, embed_dim=d, depth=depth, num_heads=heads, mlp_dim=mlp, mlp="swiglu" if swiglu else "mlp")
        if plain:
            table[f"vit_{size}_patch16_dinov3"] = dict(dims, qkv_bias=False)
        if size != "7b":
            table[f"vit_{size}_patch16_dinov3_qkvb"] = dict(dims, qkv_bias=True, key_bias=False)
    # Perception Encoder core towers (Bolya et al. 2025): CLIP's pre-norm, learned absolute position embeddings
    # and RoPE (columns first, positions from 1 beside the class token, on the pre-training grid), attention
    # pooling of every token with 8 heads, LayerNorm eps 1e-5; the head is the projection into the text space.
    pe = dict(rope=True, rope_kind="pe", rope_theta=10000.0, pre_norm=True, norm_eps=1e-5, pool="map")
    pe.update(pool_include_prefix=True, map_heads=8, mean=INCEPTION_MEAN, std=INCEPTION_STD, crop_pct=1.0)
    for name, (d, depth, heads, mlp, patch, res, ref, classes) in {
        "tiny_patch16_384": (192, 12, 3, 768, 16, 384, 24, 512),
        "small_patch16_384": (384, 12, 6, 1536, 16, 384, 24, 512),
        "base_patch16_224": (768, 12, 12, 3072, 16, 224, 14, 1024),
        "large_patch14_336": (1024, 24, 16, 4096, 14, 336, 24, 1024),
        "gigantic_patch14_448": (1536, 50, 16, 8960, 14, 448, 32, 1280),
    }.items():
        dims = dict(pe, embed_dim=d, depth=depth, num_heads=heads, mlp_dim=mlp, patch_size=patch, img_size=res)
        dims.update(rope_ref_grid=(ref, ref), num_classes=classes)
        if name.startswith("gigantic"):  # no class token: positions from 0; the pooling's MLP is 4x wide
            dims.update(class_token=False, map_mlp_dim=4 * d)
        else:
            dims["rope_offset"] = 1.0
        table[f"vit_pe_core_{name}"] = dims
    # SigLIP 2 (Tschannen et al. 2025) image towers at fixed resolutions: SigLIP's architecture (no class token,
    # attention pooling or, "_gap", the mean of the patch tokens); So400m and giant-opt are shapes of their own.
    siglip = dict(class_token=False, num_classes=0, crop_pct=0.9)
    for name, (d, depth, heads, mlp, patch, act, resolutions) in {
        "so400m_patch14": (1152, 27, 16, 4304, 14, "gelu", (224, 378)),  # (384 px: SigLIP 1, not a multiple of 14)
        "so400m_patch16": (1152, 27, 16, 4304, 16, "gelu_tanh", (256, 384, 512)),
        "giantopt_patch16": (1536, 40, 16, 6144, 16, "gelu_tanh", (256, 384)),
    }.items():
        dims = dict(siglip, embed_dim=d, depth=depth, num_heads=heads, mlp_dim=mlp, patch_size=patch, act=act)
        for res in resolutions:
            table[f"vit_{name}_siglip_{res}"] = dict(dims, img_size=res, pool="map")
            table[f"vit_{name}_siglip_gap_{res}"] = dict(dims, img_size=res, pool="gap")
    # timm's own RoPE ViTs ("SBB", Wightman et al.: registers, layer scale, EVA-02's RoPE on a 16x16 grid, the mean
    # of the patch tokens) and Naver's RoPE-ViT (Heo et al. 2024, "RoPE-Axial": columns first, theta 100, integer
    # positions; its "_ape" variants, whose learned table has no class row, load from their weights but are not
    # built here)
    sbb = dict(rope=True, rope_kind="eva", rope_theta=10000.0, rope_ref_grid=(16, 16), posemb="none", class_token=False)
    sbb.update(init_values=1e-5, pool="gap", fc_norm=True, img_size=256, patch_size=16, crop_pct=0.95)
    for name, (d, depth, heads, reg, bias) in {
        "medium_patch16_rope_reg1_gap_256": (512, 12, 8, 1, True),
        "mediumd_patch16_rope_reg1_gap_256": (512, 20, 8, 1, False),
        "betwixt_patch16_rope_reg4_gap_256": (640, 12, 10, 4, True),
        "base_patch16_rope_reg1_gap_256": (768, 12, 12, 1, True),
    }.items():
        dims = dict(sbb, embed_dim=d, depth=depth, num_heads=heads, mlp_dim=4 * d, reg_tokens=reg, qkv_bias=bias)
        norm = dict(mean=CLIP_MEAN, std=CLIP_STD) if name.startswith("betwixt") else {}
        table[f"vit_{name}"] = dict(dims, key_bias=not bias, **norm)
    naver = dict(rope=True, rope_kind="pe", rope_theta=100.0, init_values=1e-5, pool="cls", img_size=224)
    naver.update(patch_size=16, mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=0.9)
    for size, (d, depth, heads) in {"small": (384, 12, 6), "base": (768, 12, 12), "large": (1024, 24, 16)}.items():
        dims = dict(naver, embed_dim=d, depth=depth, num_heads=heads, mlp_dim=4 * d)
        table[f"vit_{size}_patch16_rope_224"] = dict(dims, posemb="none")
    # SigLIP 2's NaFlex towers (timm's NaFlexVit): the same ViT, its 16x16 position table resampled bilinearly to
    # each image's grid (any size and aspect ratio), images padded to whole patches; timm's layout of its own
    naflex = dict(siglip, act="gelu_tanh", posemb_resample="bilinear", dynamic_img_pad=True, crop_pct=1.0)
    naflex.update(pool="map", patch_size=16, img_size=256, extra={"timm_layout": "naflex"})
    table["naflexvit_base_patch16_siglip"] = dict(naflex, embed_dim=768, depth=12, num_heads=12, mlp_dim=3072)
    table["naflexvit_so400m_patch16_siglip"] = dict(naflex, embed_dim=1152, depth=27, num_heads=16, mlp_dim=4304)
    return table


BACKBONES: dict[str, dict[str, Any]] = _backbones()
"""timm's names of EVA-02, DINOv3, the Perception Encoder's core towers and SigLIP 2's So400m and giant-opt
towers -> their full :class:`ViTConfig` fields: registered models of their own (``create_model``, ``vitlab
models``)."""
_NAMES.update(BACKBONES)


def backbone_tag(name: str) -> str:
    """The tag of timm's default weights for a name of :data:`BACKBONES` (``timm/<name>.<tag>`` on the Hub)."""
    if name.startswith("eva02_"):
        if "_clip_" in name:
            return "merged2b"
        return {"224": "mim_in22k", "336": "mim_in22k_ft_in1k"}.get(name[-3:], "mim_in22k_ft_in22k_in1k")
    if name.endswith("_dinov3") or name.endswith("_dinov3_qkvb"):
        return "eupe_lvd1689m" if name.startswith("vit_tiny_") else "lvd1689m"
    if name.startswith("vit_pe_core_"):
        return "fb"
    if "_rope_" in name:
        return "sbb_in1k" if name.endswith("_gap_256") else "naver_in1k"
    return "v2_webli"

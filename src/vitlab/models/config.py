"""The model configuration: one dataclass that fully describes a ViT and serialises to JSON."""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .fields import check_fields, describe_value

__all__ = [
    "BLOCK_OBJECT_BYTES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "INCEPTION_MEAN",
    "INCEPTION_STD",
    "PROCESSOR_SIDE",
    "ViTConfig",
    "check_fields",
    "mlp_dim_for",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Google's ViT and AugReg weights take inputs scaled to [-1, 1].
INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)

PROCESSOR_SIDE = "processor_side"
"""The :attr:`ViTConfig.extra` key of the side a Hugging Face folder's image processor crops its inputs to, where it
is not the ``config.json``'s ``image_size`` (DINOv2's: 224 px, its position table made for 518): the size Hugging
Face's pipeline feeds the model, which a fine-tune without ``--img-size`` then trains at
(:func:`vitlab.train.sizing.side.init_side`) and the commands serve it at (:func:`vitlab.resolve.open_model`). A model
built at a side it was given (``vitlab.load(..., img_size=...)``, ``set_input_size``) no longer has one
(:attr:`ViTConfig.processor_side`)."""

BLOCK_OBJECT_BYTES = 64 << 10
"""Memory an encoder block's Python objects (its modules and parameter objects) take besides its tensors: 48-52 KiB
measured for a narrow block (RSS growth over 5,000 blocks, on the CPU and the meta device alike), rounded up. A
config of 100,000 blocks is ~6 GiB before any weight: :meth:`ViTConfig.build_bytes` counts it."""

_POOLS = ("cls", "gap", "map", "seq")
_STEMS = ("patch", "conv")
MAX_STEM_LAYERS = 6
"""The convolutional tokenizer halves the image side per layer: 6 layers already make a 64-pixel cell."""
_POSEMBS = ("learn", "learn2d", "sincos2d", "none")
_HEADS = ("linear", "mlp")
_ACTS = ("gelu", "gelu_tanh", "quick_gelu")
_RESAMPLE = ("jax", "bilinear", "bicubic", "bicubic-no-antialias")
_MLPS = ("mlp", "swiglu")
ROPE_KINDS = ("axial", "eva", "pe", "dinov3")
"""The 2-D RoPE conventions :mod:`.rope` computes (``rope_kind``)."""


def mlp_dim_for(embed_dim: int, mlp_ratio: float) -> int:
    """The hidden width of the blocks' MLP for ``mlp_ratio`` (``--mlp-ratio``: MLP width / token
    width ``embed_dim``, 4 in the paper), rounded to the nearest integer. The one place a ratio
    becomes a :attr:`ViTConfig.mlp_dim`, which is what the config stores."""
    if not mlp_ratio > 0:
        raise ConfigError.at("mlp_ratio", f"must be positive, got {mlp_ratio}")
    return round(embed_dim * mlp_ratio)


@dataclass
class ViTConfig:
    """Architecture and preprocessing of a Vision Transformer.

    Defaults are ViT-B/16 at 224 px with a 1000-way zero-initialised linear
    head, as fine-tuned in the paper. ``name`` is informational.
    """

    name: str = "vit_b16"
    img_size: tuple[int, int] = (224, 224)
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    qkv_bias: bool = True
    class_token: bool = True
    dist_token: bool = False
    """DeiT's distillation token (Touvron et al. 2021, "Training data-efficient image transformers &
    distillation through attention", Sec. 5): a second learned token after the class token, read by
    its own classifier ``head_dist``; the logits are the mean of both heads (in distilled training
    both are returned, :meth:`~.vit.VisionTransformer.set_distilled_training`)."""
    reg_tokens: int = 0
    """Register tokens (Darcet et al. 2024, "Vision Transformers Need Registers"): learned tokens
    (``reg_token``, timm's name) put after the class token, attended to and discarded at the end;
    they take over the global computation that otherwise creates high-norm artefact patches."""
    pool: str = "cls"
    """``cls``: the class token's final state (Eq. 4); ``gap``: mean of the patch tokens; ``map``:
    multihead attention pooling of all tokens by a learned query (:class:`~.layers.MAPHead`, SigLIP); ``seq``:
    CCT's sequence pooling, the patch tokens weighted by a softmax of a learned linear score
    (:class:`~.layers.SeqPool`; no timm ``global_pool`` name)."""
    init_values: float | None = None
    """Layer scale (Touvron et al. 2021, CaiT, Sec. 2.1; DINOv2): each residual branch multiplied by a
    learned per-channel ``gamma`` initialised to this value; None: no layer scale (the paper)."""
    qk_norm: bool = False
    """LayerNorm on each head's queries and keys (Dehghani et al. 2023, ViT-22B, Sec. 2)."""
    pre_norm: bool = False
    """CLIP's image tower (Radford et al. 2021): a LayerNorm on the embedded sequence z_0 before the
    blocks (``norm_pre``, timm's name), and a patch projection without bias."""
    key_bias: bool = True
    """With ``qkv_bias``: whether the keys have a bias too. BEiT (Bao et al. 2022, Sec. 2), EVA (Fang et al.
    2023) and DINOv3 (Simeoni et al. 2025) leave it out; the queries' and values' biases are then
    ``attn.q_bias`` and ``attn.v_bias`` (timm's names) and ``attn.qkv`` has none."""
    attn_norm: bool = False
    """A LayerNorm on the attention's concatenated heads before the output projection (NormFormer, Shleifer
    et al. 2021; EVA-02's CLIP towers, timm's ``scale_attn_inner``): ``attn.norm``."""
    mlp: str = "mlp"
    """The block's MLP: ``mlp``, two layers with ``act`` between (Sec. 3.1); ``swiglu``, the gated linear unit
    with a SiLU gate (Shazeer 2020, "GLU Variants Improve Transformer"; EVA-02, DINOv3 S+/H+/7B),
    ``fc2(silu(fc1_g(x)) * fc1_x(x))`` with ``fc1_g`` and ``fc1_x`` each ``mlp_dim`` wide (timm's ``SwiGLU``)."""
    mlp_norm: bool = False
    """A LayerNorm on the MLP's hidden activations before ``fc2`` (NormFormer; EVA-02 B/L, timm's
    ``scale_mlp``): ``mlp.norm``."""
    fc_norm: bool = False
    """With ``gap``: apply the final LayerNorm after pooling (timm's ``fc_norm``, MAE/DeiT style)
    instead of to every token before pooling (official JAX / big_vision)."""
    posemb: str = "learn"
    """``learn`` (1-D, the paper's default), ``learn2d`` (Appendix D.4: row and column
    embeddings of D/2 each, concatenated), ``sincos2d`` (fixed), ``none``."""
    rope: bool = False
    """2-D rotary position embeddings on the patch tokens' queries and keys in every block (EVA-02,
    Fang et al. 2023; DINOv3, Simeoni et al. 2025; :mod:`.rope`); usually with ``posemb="none"``. The
    head width must be divisible by 4. Not timm's ``Eva`` parameter names."""
    rope_theta: float = 100.0
    """RoPE's base period: frequency ``k`` of an axis (``n = head_dim / 4`` each) is ``theta**(-k/n)``; 100 in
    DINOv3, 10000 in EVA-02 and the Perception Encoder."""
    rope_kind: str = "axial"
    """Which 2-D RoPE convention (:mod:`.rope`): ``axial`` (vitlab's: integer rows and columns, each half of the
    head rotated as a half), ``eva`` (EVA-02, timm's ``RotaryEmbeddingCat``: adjacent channel pairs, rows then
    columns, integer positions plus ``rope_offset`` scaled to ``rope_ref_grid``), ``pe`` (the Perception
    Encoder, Bolya et al. 2025: as ``eva`` with columns first) or ``dinov3`` (patch centres normalised to
    [-1, 1] per axis, angles ``2 pi x theta**(-k/n)``, the head rotated as one half)."""
    rope_ref_grid: tuple[int, int] | None = None
    """``eva``/``pe``: positions are rescaled as if the grid were this one (the pre-training grid, timm's
    ``ref_feat_shape``: 16x16 for every EVA-02); None: integer positions as they are."""
    rope_offset: float = 0.0
    """``eva``/``pe``: added to every integer position before rescaling (1 in PE core T/S/B/L, timm's
    ``rope_grid_offset``)."""
    posemb_resample: str = "bicubic"
    """How learned position embeddings are resampled to another grid: ``jax`` | ``bicubic`` | ``bilinear`` |
    ``bicubic-no-antialias`` (Hugging Face's ``Dinov2Model``; :func:`~.posemb.resample_posemb`)."""
    pool_include_prefix: bool = False
    """``map`` and ``gap``: pool the class and register tokens too (timm's ``pool_include_prefix``; the
    Perception Encoder's attention pooling reads every token), not only the patches."""
    map_heads: int | None = None
    """Heads of the ``map`` pooling's attention (timm's ``attn_pool_num_heads``; 8 in the Perception Encoder);
    None: ``num_heads``."""
    map_mlp_dim: int | None = None
    """Hidden width of the ``map`` pooling's MLP (timm's ``attn_pool_mlp_ratio`` x width); None: ``mlp_dim``."""
    head: str = "linear"
    """``linear``: one zero-initialised layer (fine-tuning); ``mlp``: a tanh pre-logits layer then
    the classifier (pre-training, Sec. 3.1)."""
    representation_size: int | None = None
    """Width of the pre-logits layer of the ``mlp`` head (defaults to ``embed_dim``)."""
    act: str = "gelu"
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    patch_drop_rate: float = 0.0
    """Training only: the fraction of patch tokens each image drops after Eq. 1 (PatchDropout, Liu et al.
    2022; FLIP, Li et al. 2023; timm's ``patch_drop_rate``); evaluation sees every token."""
    norm_eps: float = 1e-6
    hybrid_layers: tuple[int, ...] | None = None
    """Hybrid (Sec. 3.1): ResNet stages whose feature map is cut into patches. ``None`` = plain
    ViT on pixels; ``()`` = the ResNet stem only; ``(3, 4, 9)`` = the paper's R50."""
    stem: str = "patch"
    """What makes the tokens: ``patch``, Eq. 1's P x P patches (of the pixels, or of the ResNet's feature map
    with ``hybrid_layers``); ``conv``, the convolutional tokenizer of CCT (Hassani et al. 2021, "Escaping the
    Big Data Paradigm with Compact Transformers", Sec. 3): ``stem_layers`` times a 3x3 convolution (stride 1,
    no bias), ReLU and a 3x3/2 max-pool, the last convolution ``embed_dim`` wide and the others
    ``stem_width``; each cell of its feature map is a token (``patch_size`` 1, another CNN stem of Sec. 3.1)."""
    stem_layers: int = 1
    stem_width: int = 64
    attention: str = "global"
    """``global`` self-attention, or ``axial`` (Appendix D.6: attention along rows, then columns)."""
    dynamic_img_pad: bool = False
    """Zero-pad inputs whose size the patch size does not divide, instead of raising."""
    mean: tuple[float, float, float] = INCEPTION_MEAN
    std: tuple[float, float, float] = INCEPTION_STD
    crop_pct: float = 1.0
    """Evaluation preprocessing (timm's ``crop_pct``): images are resized to ``img_size / crop_pct``, then
    the centre ``img_size`` is cropped. 1.0 (resize straight to ``img_size``) for the models vitlab trains
    (their recipe's value), timm's value for timm's names and checkpoints (0.9 at 224 px for most)."""
    class_names: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form metadata kept with the weights (source checkpoint, training run ...)."""

    def __post_init__(self) -> None:
        self._check_types()
        if "crop_pct" in self.extra:  # a run's model/ records its recipe's crop_pct there (and did before the field)
            self.extra = dict(self.extra)
            self.crop_pct = check_fields({"crop_pct": self.extra.pop("crop_pct")})["crop_pct"]
        self.validate()

    def _check_types(self) -> None:
        for k, v in check_fields({f.name: getattr(self, f.name) for f in dataclasses.fields(self)}).items():
            setattr(self, k, v)

    def num_params(self) -> int:
        """Parameters of the model this config builds, from the config alone (no allocation).

        Counted as the modules of :mod:`.vit` and :mod:`.hybrid` create them (class token, position
        embeddings, blocks, norms, head, a hybrid's BiT ResNet); :mod:`vitlab.checkpoints` checks it
        against its parameter cap before it builds a model from an untrusted config."""
        d, m, b = self.embed_dim, self.mlp_dim, int(self.qkv_bias)
        block = self.block_params()
        tokens = self.num_patches + self.num_prefix_tokens
        posemb = {"learn": tokens * d, "learn2d": (sum(self.grid_size)) * d // 2}.get(self.posemb, 0)
        if self.stem == "conv":  # 3x3 convolutions without bias: in_chans -> stem_width ... -> embed_dim
            widths = [self.in_chans] + [self.stem_width] * (self.stem_layers - 1) + [d]
            patch = sum(9 * a * b for a, b in itertools.pairwise(widths))
        elif self.hybrid_layers is None:
            patch = d * self.in_chans * self.patch_size**2 + (0 if self.pre_norm else d)
        else:  # the stem (7x7 conv to 64, GroupNorm), then bottleneck stages of widths 256 * 2**i
            patch, chs = 64 * self.in_chans * 49 + 2 * 64, 64
            for i, units in enumerate(self.hybrid_layers):
                out = 256 * 2**i
                mid = out // 4
                patch += chs * out + 2 * out  # the first unit's projection shortcut
                for u in range(units):
                    patch += (chs if u == 0 else out) * mid + mid * mid * 9 + mid * out + 4 * mid + 2 * out
                chs = out
            patch += d * chs * self.patch_size**2 + d
        rep = self.pre_logits_dim
        head = (d * rep + rep if self.head == "mlp" else 0) + (rep * self.num_classes + self.num_classes)
        head *= 2 if self.dist_token else 1
        head += d + 1 if self.pool == "seq" else 0  # the score layer
        if self.pool == "map":  # latent, q, kv, proj, norm, MLP
            mm = self.map_mlp_dim or m
            head += d + 3 * d * d + 3 * d * b + d * d + d + 2 * d + d * mm + mm + mm * d + d
        norms = 2 * d * (2 if self.pre_norm else 1)
        return patch + d * self.num_prefix_tokens + posemb + self.depth * block + norms + head

    def block_params(self) -> int:
        """Parameters of one encoder block (Eq. 2-3: two LayerNorms, qkv and the output projection, the MLP; layer
        scale, the qk LayerNorms, q/v-only biases, a SwiGLU MLP and NormFormer's norms when asked for; an axial
        block is two of them, its row and its column half), from the config alone."""
        d, m, b = self.embed_dim, self.mlp_dim, int(self.qkv_bias)
        qkv_bias = (3 if self.key_bias else 2) * d * b  # (q and v only: BEiT / EVA / DINOv3)
        mlp = (2 if self.mlp == "swiglu" else 1) * (d * m + m) + m * d + d + (2 * m if self.mlp_norm else 0)
        block = 2 * 2 * d + 3 * d * d + qkv_bias + d * d + d + mlp + (2 * d if self.attn_norm else 0)
        block += (2 * d if self.init_values is not None else 0) + (4 * (d // self.num_heads) if self.qk_norm else 0)
        return 2 * block if self.attention == "axial" else block

    def build_bytes(self, *, tensors: bool = True) -> int:
        """Memory that building this model takes, from the config alone: its float32 parameters (``tensors``;
        False on the meta device, which allocates none) and its blocks' Python objects
        (:data:`BLOCK_OBJECT_BYTES` a block). What a size check compares before any module is built."""
        return (4 * self.num_params() if tensors else 0) + self.depth * BLOCK_OBJECT_BYTES

    @property
    def stem_stride(self) -> int:
        """Pixels per feature-map cell before patching: 1 for a plain ViT, the CNN's stride for a hybrid."""
        if self.stem == "conv":
            return 2**self.stem_layers
        if self.hybrid_layers is None:
            return 1
        return 4 * 2 ** max(len(self.hybrid_layers) - 1, 0)

    @property
    def processor_side(self) -> int | None:
        """The side Hugging Face's image processor feeds this model at where it is smaller than the model's own
        (:data:`PROCESSOR_SIDE`: DINOv2's 224 px for a table made for 518), for a square model; a value that is not a
        smaller multiple of the token's pixels is not one (``extra`` is read from a file). None otherwise."""
        fed = self.extra.get(PROCESSOR_SIDE)
        token = self.patch_size * self.stem_stride
        square = self.img_size[0] == self.img_size[1]
        return fed if square and type(fed) is int and 0 < fed < self.img_size[0] and fed % token == 0 else None

    @property
    def grid_size(self) -> tuple[int, int]:
        """Patch grid (rows, columns) at ``img_size``."""
        p, s = self.patch_size, self.stem_stride
        h, w = (-(-self.img_size[0] // s), -(-self.img_size[1] // s))
        if self.dynamic_img_pad:
            return (-(-h // p), -(-w // p))
        return (h // p, w // p)

    @property
    def num_patches(self) -> int:
        gh, gw = self.grid_size
        return gh * gw

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: the class token, the distillation token, then the registers."""
        return (1 if self.class_token else 0) + (1 if self.dist_token else 0) + self.reg_tokens

    @property
    def mlp_ratio(self) -> float:
        """MLP width / token width (``mlp_dim / embed_dim``); the inverse of :func:`mlp_dim_for`."""
        return self.mlp_dim / self.embed_dim

    @property
    def pre_logits_dim(self) -> int:
        return (self.representation_size or self.embed_dim) if self.head == "mlp" else self.embed_dim

    def validate(self) -> None:
        """Raise ``ValueError`` naming the offending option."""

        def bad(option: str, msg: str) -> None:
            raise ConfigError.at(option, msg)

        for opt, val, allowed in (
            ("pool", self.pool, _POOLS),
            ("posemb", self.posemb, _POSEMBS),
            ("head", self.head, _HEADS),
            ("act", self.act, _ACTS),
            ("posemb_resample", self.posemb_resample, _RESAMPLE),
            ("stem", self.stem, _STEMS),
            ("mlp", self.mlp, _MLPS),
            ("rope_kind", self.rope_kind, ROPE_KINDS),
        ):
            if val not in allowed:
                bad(opt, f"{val!r} is not one of {', '.join(allowed)}")
        for opt in ("patch_size", "in_chans", "embed_dim", "depth", "num_heads", "mlp_dim", "stem_width"):
            if int(getattr(self, opt)) <= 0:
                bad(opt, f"must be positive, got {getattr(self, opt)}")
        if self.num_classes < 0:
            bad("num_classes", f"must be >= 0 (0 means no head), got {self.num_classes}")
        if min(self.img_size) <= 0:
            bad("img_size", f"must be positive, got {self.img_size}")
        if self.embed_dim % self.num_heads:
            bad("num_heads", f"the width {self.embed_dim} is not divisible by {self.num_heads} heads")
        if self.attention not in ("global", "axial"):
            bad("attention", f"{self.attention!r} is not one of global, axial")
        if not 1 <= self.stem_layers <= MAX_STEM_LAYERS:
            bad("stem_layers", f"must be in 1..{MAX_STEM_LAYERS}, got {self.stem_layers}")
        if self.stem == "conv" and (self.hybrid_layers is not None or self.patch_size != 1 or self.pre_norm):
            bad("stem", "'conv' makes the tokens itself: it needs hybrid_layers None, patch_size 1 and no pre_norm")
        h, w = self.img_size
        p = self.patch_size * self.stem_stride
        if not self.dynamic_img_pad and (h % p or w % p):
            raise ConfigError.at(
                "img_size",
                f"{h}x{w} is not divisible by the patch size {p}"
                f"{' (the stem stride x patch)' if self.stem_stride > 1 else ''}; use a multiple of {p} "
                f"(e.g. {max(p, h // p * p)})",
                python=" or dynamic_img_pad=True",
            )
        if self.pool == "cls" and not self.class_token:
            bad("pool", "'cls' pooling needs class_token=True")
        if self.dist_token and (self.pool != "cls" or self.head != "linear"):
            bad("dist_token", "the distillation head needs pool='cls' and head='linear' (as DeiT)")
        if self.pre_norm and self.hybrid_layers is not None:
            bad("pre_norm", "CLIP's pre-norm is not supported with a hybrid stem")
        if self.reg_tokens and self.attention == "axial":
            bad("reg_tokens", "register tokens are not supported with axial attention")
        if self.fc_norm and self.pool != "gap":
            bad("fc_norm", "only applies with pool='gap'")
        if self.posemb == "learn2d" and self.embed_dim % 2:
            bad("posemb", f"'learn2d' needs an even width, got {self.embed_dim}")
        if self.posemb == "sincos2d" and self.embed_dim % 4:
            bad("posemb", f"'sincos2d' needs a width divisible by 4, got {self.embed_dim}")
        if self.rope and (self.embed_dim // self.num_heads) % 4:
            bad("rope", f"2-D RoPE needs a head width divisible by 4, got {self.embed_dim // self.num_heads}")
        if self.rope and self.attention == "axial":
            bad("rope", "2-D RoPE is not supported with axial attention")
        if self.rope and not self.rope_theta > 0:
            bad("rope_theta", f"must be positive, got {self.rope_theta}")
        if self.rope_kind != "axial" and not self.rope:
            bad("rope_kind", f"{self.rope_kind!r} needs rope=True")
        if self.rope_ref_grid is not None and (self.rope_kind not in ("eva", "pe") or min(self.rope_ref_grid) <= 0):
            bad("rope_ref_grid", "a positive (rows, columns) pair, only with rope_kind 'eva' or 'pe'")
        if self.pool_include_prefix and self.pool not in ("map", "gap"):
            bad("pool_include_prefix", "only applies with pool 'map' or 'gap'")
        for opt in ("map_heads", "map_mlp_dim"):
            if getattr(self, opt) is not None and self.pool != "map":
                bad(opt, "only applies with pool='map'")
        if self.map_heads is not None and (self.map_heads <= 0 or self.embed_dim % self.map_heads):
            bad("map_heads", f"the width {self.embed_dim} is not divisible by {self.map_heads} heads")
        if self.map_mlp_dim is not None and self.map_mlp_dim <= 0:
            bad("map_mlp_dim", f"must be positive, got {self.map_mlp_dim}")
        if not 0.0 < self.crop_pct <= 1.0:
            bad("crop_pct", f"must be in (0, 1], got {self.crop_pct}")
        if not self.norm_eps > 0:
            bad("norm_eps", f"must be positive, got {self.norm_eps}")
        if self.patch_drop_rate and self.attention == "axial":
            bad("patch_drop_rate", "token dropping needs global attention (axial attention needs the whole grid)")
        for opt in ("drop_rate", "attn_drop_rate", "drop_path_rate", "patch_drop_rate"):
            if not 0.0 <= float(getattr(self, opt)) < 1.0:
                bad(opt, f"must be in [0, 1), got {getattr(self, opt)}")
        if self.class_names is not None and self.num_classes and len(self.class_names) != self.num_classes:
            bad("class_names", f"{len(self.class_names)} names for {self.num_classes} classes")

    def at_size(self, img_size: int | tuple[int, int]) -> ViTConfig:
        """A copy at the input size ``img_size`` (an int: square): an image processor's other side
        (:attr:`processor_side`) no longer applies to it and is left out."""
        return self.replace(img_size=img_size, extra={k: v for k, v in self.extra.items() if k != PROCESSOR_SIDE})

    def replace(self, **changes: Any) -> ViTConfig:
        """A copy with some fields changed (validated)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown ViTConfig option(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["img_size"] = list(self.img_size)
        d["rope_ref_grid"] = None if self.rope_ref_grid is None else list(self.rope_ref_grid)
        d["mean"] = list(self.mean)
        d["std"] = list(self.std)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        extra = kwargs.pop("extra", None) or {}
        if not isinstance(extra, dict):
            raise ConfigError.at("extra", f"expected an object, got {describe_value(extra)}")
        extra = dict(extra)
        extra.update({k: v for k, v in d.items() if k not in known})
        return cls(**kwargs, extra=extra)

    @classmethod
    def from_json(cls, s: str) -> ViTConfig:
        return cls.from_dict(json.loads(s))

"""Building blocks of the Vision Transformer (Dosovitskiy et al., 2021, Sec. 3.1).

Read top-down: the patch embedding of Eq. 1, multi-head self-attention, the MLP, stochastic
depth, and the encoder block of Eq. 2-3 that puts them together. Module and parameter names
follow timm (``patch_embed.proj``, ``attn.qkv``, ``mlp.fc1`` ...) because parameter names are
API: they let the world's weights load without a rename table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, InputError
from .rope import RotaryPosition2D

__all__ = [
    "Attention",
    "Block",
    "DropPath",
    "LayerScale",
    "MAPHead",
    "Mlp",
    "Packing",
    "PatchDropout",
    "PatchEmbed",
    "QuickGELU",
    "SeqPool",
    "SwiGLU",
    "make_act",
    "set_patch_drop",
]


def make_act(name: str) -> nn.Module:
    """GELU as in the paper: ``gelu`` is exact (timm, HF), ``gelu_tanh`` the
    tanh approximation used by the official JAX code (``flax.linen.gelu``)."""
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "relu":
        return nn.ReLU()
    if name == "quick_gelu":
        return QuickGELU()
    raise ConfigError(f"unknown activation {name!r}; choose 'gelu', 'gelu_tanh', 'quick_gelu' or 'relu'")


class QuickGELU(nn.Module):
    """``x * sigmoid(1.702 x)``: the GELU approximation OpenAI's CLIP was trained with (Radford et al. 2021)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def _check_image(x: torch.Tensor, in_chans: int, patch: int, dynamic_pad: bool) -> torch.Tensor:
    """``x`` checked for the patch embedding, padded on the bottom/right when ``dynamic_pad``."""
    if x.ndim != 4:
        raise InputError(f"expected an image batch of shape (B, C, H, W), got shape {tuple(x.shape)}")
    _, c, h, w = x.shape
    if c != in_chans:
        raise InputError(f"the model takes {in_chans}-channel images, got {c} channels (input shape {tuple(x.shape)})")
    if h % patch or w % patch:
        if not dynamic_pad:
            raise InputError(
                f"image size {h}x{w} is not divisible by the patch size {patch}; resize to a multiple of {patch} "
                f"(e.g. {max(patch, h // patch * patch)}x{max(patch, w // patch * patch)}) "
                "or build the model with dynamic_img_pad=True"
            )
        x = F.pad(x, (0, (-w) % patch, 0, (-h) % patch))
    return x


# torch.fx (torchvision's feature extractor) records the check as one call instead of tracing
# into its Python branches on the input's shape.
torch.fx.wrap("_check_image")


class PatchEmbed(nn.Module):
    """Eq. 1's ``x_p E``: cut the image into P x P patches, flatten, project to D.

    A convolution with kernel = stride = P is exactly the linear projection of
    the flattened patches (weights laid out as ``(D, C, P, P)``), and is what
    timm and the official code store.
    """

    def __init__(
        self, *, patch_size: int, in_chans: int, embed_dim: int, dynamic_pad: bool = False, bias: bool = True
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.in_chans = in_chans
        self.dynamic_pad = dynamic_pad
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid (rows, columns) for an input of this size."""
        p = self.patch_size
        if self.dynamic_pad:  # ceiling division, written so that a symbolic trace can follow it
            return -(-height // p), -(-width // p)
        return height // p, width // p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, N, D)`` with N = HW / P^2, patches in row-major order."""
        x = _check_image(x, self.in_chans, self.patch_size, self.dynamic_pad)
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention (MSA, Eq. 2 and Appendix A):
    ``softmax(q k^T / sqrt(D_h)) v`` per head, heads concatenated and projected.

    ``F.scaled_dot_product_attention`` computes it without materialising the weights; when
    they are asked for (``return_attention=True``) the softmax is written out instead, the
    same maths, so analyses get the exact weights.

    ``qk_norm`` (Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion Parameters",
    Sec. 2) applies a LayerNorm to each head's queries and keys before their dot product
    (``q_norm``, ``k_norm``, as timm), which keeps the attention logits from growing without bound.

    ``rope_theta`` (2-D rotary position embeddings, EVA-02 / DINOv3: :mod:`.rope`) rotates the patch
    tokens' queries and keys (after qk-norm) by the table the model passes as ``rope``, in the convention
    ``rope_kind`` (with ``rope_ref_grid`` and ``rope_offset``).

    ``key_bias=False`` (BEiT, Bao et al. 2022; EVA; DINOv3) keeps the biases of the queries and values only,
    as ``q_bias`` and ``v_bias`` (timm's names): a key bias adds ``q . b_k`` to every logit of a query and so
    cancels in the softmax, unless RoPE turns it with the key's position. ``attn_norm`` (NormFormer, Shleifer
    et al. 2021; EVA-02's CLIP towers) normalises the concatenated heads before the projection (``norm``).
    """

    def __init__(
        self,
        *,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        rope_theta: float | None = None,
        rope_kind: str = "axial",
        rope_ref_grid: tuple[int, int] | None = None,
        rope_offset: float = 0.0,
        key_bias: bool = True,
        attn_norm: bool = False,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ConfigError(f"width {dim} is not divisible by the number of heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        qv_only = qkv_bias and not key_bias
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias and not qv_only)
        if qv_only:  # (absent otherwise, as every option's parameters: the paper's attention has none of its own)
            self.q_bias = nn.Parameter(torch.zeros(dim))
            self.v_bias = nn.Parameter(torch.zeros(dim))
        self.q_norm = nn.LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else nn.Identity()
        self.attn_drop = attn_drop
        if attn_norm:
            self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if rope_theta is not None:
            self.rope = RotaryPosition2D(
                self.head_dim, theta=rope_theta, kind=rope_kind, ref_grid=rope_ref_grid, offset=rope_offset
            )

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """``x W_qkv + b``: the stacked queries, keys and values ``(B, T, 3D)``; with q/v biases only, the keys'
        third of the bias is zero."""
        q_bias = getattr(self, "q_bias", None)
        if q_bias is None:
            return self.qkv(x)
        bias = torch.cat([q_bias, torch.zeros_like(q_bias), self.v_bias])
        return F.linear(x, self.qkv.weight, bias)

    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attention: bool = False,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``(B, T, D)`` -> ``(B, T, D)``; with ``return_attention`` also the weights ``(B, heads, T, T)``;
        ``rope``: the ``(cos, sin)`` table of the patch tokens (:meth:`.rope.RotaryPosition2D.table`);
        ``packing``: the sequences hold packed images, each token attends only to its own image's
        (:class:`.packed.PackedAttention`)."""
        b, n, d = x.shape
        q, k, v = self.project_qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = self.rope(q, rope), self.rope(k, rope)
        drop = self.attn_drop if self.training else 0.0
        if return_attention:
            logits = (q * self.scale) @ k.transpose(-2, -1)
            if packing is not None:
                logits = logits.masked_fill(~packing.mask(), float("-inf"))
            weights = logits.softmax(dim=-1)
            out = F.dropout(weights, p=drop, training=self.training) @ v
        elif packing is not None:
            out = packing.attend(q, k, v, dropout_p=drop)
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
        out = out.transpose(1, 2).reshape(b, n, d)
        if "norm" in self._modules:  # attn_norm (NormFormer)
            out = self.norm(out)
        out = self.proj_drop(self.proj(out))
        return (out, weights) if return_attention else out


class Mlp(nn.Module):
    """The block's MLP: two layers with a GELU between (Sec. 3.1). ``hidden_norm``: a LayerNorm on the hidden
    activations before ``fc2`` (NormFormer, Shleifer et al. 2021; timm's ``scale_mlp``), named ``norm``."""

    def __init__(
        self,
        *,
        dim: int,
        hidden_dim: int,
        act: str = "gelu",
        drop: float = 0.0,
        hidden_norm: bool = False,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = make_act(act)
        self.drop1 = nn.Dropout(drop)
        if hidden_norm:  # (absent otherwise: the paper's MLP has no such submodule)
            self.norm = nn.LayerNorm(hidden_dim, eps=norm_eps)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop1(self.act(self.fc1(x)))
        if "norm" in self._modules:
            h = self.norm(h)
        return self.drop2(self.fc2(h))


class SwiGLU(nn.Module):
    """The gated MLP of EVA-02 and DINOv3's larger models: a GLU (Dauphin et al. 2017) with a SiLU gate,
    SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer", Eq. 6),

        ``MLP(x) = (silu(x W_g) * (x W_x)) W_2``,

    with ``W_g`` (``fc1_g``) and ``W_x`` (``fc1_x``) each ``hidden_dim`` wide and biased, ``W_2`` (``fc2``):
    timm's ``SwiGLU`` names (Meta's DINOv3 calls them ``w1``, ``w2``, ``w3``; Hugging Face ``gate_proj``,
    ``up_proj``, ``down_proj``). ``hidden_norm`` as in :class:`Mlp` (EVA-02 B/L). ``act`` is ignored: the
    gate is the SiLU of the definition."""

    def __init__(
        self,
        *,
        dim: int,
        hidden_dim: int,
        act: str = "silu",
        drop: float = 0.0,
        hidden_norm: bool = False,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.fc1_g = nn.Linear(dim, hidden_dim)
        self.fc1_x = nn.Linear(dim, hidden_dim)
        self.act = nn.SiLU()
        self.drop1 = nn.Dropout(drop)
        if hidden_norm:
            self.norm = nn.LayerNorm(hidden_dim, eps=norm_eps)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop1(self.act(self.fc1_g(x)) * self.fc1_x(x))
        if "norm" in self._modules:
            h = self.norm(h)
        return self.drop2(self.fc2(h))


class DropPath(nn.Module):
    """Stochastic depth (Huang et al., 2016): drop a whole residual branch per sample."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def scale(self, x: torch.Tensor) -> torch.Tensor | None:
        """The per-sample factor for a batch like ``x`` (0 or 1/keep, shaped to broadcast),
        drawn from the global RNG; None when nothing is dropped (p = 0 or eval)."""
        if self.p == 0.0 or not self.training:
            return None
        keep = 1.0 - self.p
        return x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep).div_(keep)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scale(x)
        return x if s is None else x * s

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Packing(Protocol):
    """What attention needs of packed sequences (NaViT: Dehghani et al. 2023) to keep each image's tokens to
    themselves: the boolean ``(B, 1, S, S)`` mask of which token may attend to which, and the attention of ``q``,
    ``k``, ``v`` within each image (:class:`~vitlab.models.packed.PackedAttention` is the one vitlab builds)."""

    def mask(self) -> torch.Tensor: ...

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float = 0.0) -> torch.Tensor: ...


class PatchDropout(nn.Module):
    """Token dropping in training (PatchDropout, Liu et al. 2022, "PatchDropout: Economizing Vision
    Transformers Using Patch Dropout"; FLIP, Li et al. 2023): each image keeps a random
    ``max(1, int(N * (1 - p)))`` of its ``N`` patch tokens, drawn from the global RNG, after the position
    embeddings are added, so the kept tokens still know where they came from. The prefix tokens (class,
    distillation, registers) are always kept. Attention and MLP cost shrink with the sequence; evaluation
    (``eval()``) sees every token. Named and drawn as timm's ``PatchDropout`` (``ordered=False``)."""

    def __init__(self, p: float = 0.0, *, num_prefix_tokens: int = 1) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ConfigError(f"patch_drop_rate: must be in [0, 1), got {p}")
        self.p = p
        self.num_prefix_tokens = num_prefix_tokens
        self.kept: torch.Tensor | None = None
        """The patches the last forward kept, ``(B, kept)`` (None: all): 2-D RoPE rotates each kept token by its
        own place (:meth:`~.vit.VisionTransformer.encode`, as timm's ``apply_keep_indices_nlc``)."""

    def keep_indices(self, x: torch.Tensor) -> torch.Tensor | None:
        """Indices ``(B, kept)`` of the patch tokens of ``x`` to keep, or None when all are kept."""
        if self.p == 0.0 or not self.training:
            return None
        b, n = x.shape[0], x.shape[1] - self.num_prefix_tokens
        keep = max(1, int(n * (1.0 - self.p)))
        return torch.argsort(torch.randn(b, n, device=x.device), dim=-1)[:, :keep]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = self.kept = self.keep_indices(x)
        if idx is None:
            return x
        pre, patches = x[:, : self.num_prefix_tokens], x[:, self.num_prefix_tokens :]
        patches = patches.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        return torch.cat([pre, patches], dim=1)


def set_patch_drop(model: nn.Module, rate: float) -> bool:
    """Set the token-drop rate of every :class:`PatchDropout` in ``model`` (a ViT, or a module around one); True when
    one changed. A model built without token dropping has none to set (its rate stays 0). Every forward reads the
    rate, so a schedule that ends token dropping part-way (FLIP's unmasked tuning) switches it here."""
    changed = False
    for layer in model.modules():
        if isinstance(layer, PatchDropout) and layer.p != rate:
            layer.p, changed = rate, True
    return changed

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerScale(nn.Module):
    """A learned per-channel scale of a residual branch, ``gamma * branch(z)``, started at a small
    ``init_values`` so each block begins close to the identity (Touvron et al. 2021, "Going deeper
    with Image Transformers" (CaiT), Sec. 2.1; used by DINOv2). Named ``gamma`` as in timm."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.init_values = init_values
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """One pre-LayerNorm Transformer encoder layer, Eq. 2-3:

    ``z' = MSA(LN(z)) + z`` and ``z = MLP(LN(z')) + z'``.

    With ``init_values`` each branch is scaled by a :class:`LayerScale` (``ls1``, ``ls2``, identities
    otherwise); with ``qk_norm`` the attention normalises queries and keys (:class:`Attention`).
    ``attn_layer`` and ``mlp_layer`` swap in other attention or MLP classes taking the same
    keyword arguments, as timm's ``Block`` does (:class:`SwiGLU` for ``mlp="swiglu"``); ``attn_options``
    are further keyword arguments of the attention (RoPE's convention, q/v-only biases, ``attn_norm``) and
    ``mlp_norm`` normalises the MLP's hidden activations.
    """

    def __init__(
        self,
        *,
        dim: int,
        num_heads: int,
        mlp_dim: int,
        qkv_bias: bool = True,
        act: str = "gelu",
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_eps: float = 1e-6,
        init_values: float | None = None,
        qk_norm: bool = False,
        rope_theta: float | None = None,
        attn_layer: Callable[..., nn.Module] = Attention,
        mlp_layer: Callable[..., nn.Module] = Mlp,
        attn_options: dict[str, Any] | None = None,
        mlp_norm: bool = False,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        qk = {"qk_norm": True, "norm_eps": norm_eps} if qk_norm else {}  # (other attention classes need not know it)
        if rope_theta is not None:
            qk["rope_theta"] = rope_theta
        if attn_options:  # the later options (rope_kind, key_bias, attn_norm ...), passed only when set
            qk.update(attn_options)
            qk.setdefault("norm_eps", norm_eps)
        self.attn = attn_layer(
            dim=dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop, **qk
        )
        self.ls1 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        hidden = {"hidden_norm": True, "norm_eps": norm_eps} if mlp_norm else {}
        self.mlp = mlp_layer(dim=dim, hidden_dim=mlp_dim, act=act, drop=drop, **hidden)
        self.ls2 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attention: bool = False,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``(B, T, D)`` -> ``(B, T, D)``; with ``return_attention`` also the MSA weights; ``rope``: the
        patch tokens' rotary table (with ``rope_theta``); ``packing``: attention within each packed image."""
        kw: dict[str, Any] = {"rope": rope} if rope is not None else {}
        if packing is not None:
            kw["packing"] = packing
        if return_attention:
            y, weights = self.attn(self.norm1(x), return_attention=True, **kw)
        else:
            y = self.attn(self.norm1(x), **kw)
        x = x + self.drop_path1(self.ls1(y))  # Eq. 2
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))  # Eq. 3
        return (x, weights) if return_attention else x


class MAPHead(nn.Module):
    """Multihead attention pooling ("MAP"): one learned query (``latent``) attends over all the
    encoded tokens, then an MLP with a residual, ``y = a + MLP(LN(a))`` (Lee et al. 2019, "Set
    Transformer", PMA; Zhai et al. 2022, "Scaling Vision Transformers", Sec. 3.2; SigLIP's
    pooling). It replaces Eq. 4's class token; names are timm's ``AttentionPoolLatent``
    (big_vision's ``MAPHead``: ``probe``, ``MultiHeadDotProductAttention_0``, ``LayerNorm_0``,
    ``MlpBlock_0``)."""

    def __init__(
        self,
        *,
        dim: int,
        num_heads: int,
        mlp_dim: int,
        qkv_bias: bool = True,
        act: str = "gelu",
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ConfigError(f"width {dim} is not divisible by the pooling's {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim=dim, hidden_dim=mlp_dim, act=act)

    def forward(self, x: torch.Tensor, size: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, T, D)`` -> ``(B, D)``; ``size`` ``(B, T, 1)``: how many patches each token stands for after
        token merging (proportional attention: ``log size`` added to the logits, :mod:`.tome`)."""
        b, t, d = x.shape
        q = self.q(self.latent).view(1, 1, self.num_heads, self.head_dim).transpose(1, 2).expand(b, -1, -1, -1)
        k, v = self.kv(x).view(b, t, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        bias = None if size is None else size.log().view(b, 1, 1, t)
        a = self.proj(F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(b, 1, d))
        return (a + self.mlp(self.norm(a)))[:, 0]


class SeqPool(nn.Module):
    """Sequence pooling (Hassani et al. 2021, "Escaping the Big Data Paradigm with Compact Transformers",
    Sec. 3.2, CCT's ``attention_pool``): a learned linear score per token, softmax over the sequence, and the
    tokens' mean weighted by it, ``softmax(x w + b)^T x``. It replaces Eq. 4's class token; timm has no such pooling."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.score = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, size: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, T, D)`` -> ``(B, D)``; ``size`` ``(B, T, 1)``: how many patches each token stands for after token
        merging (``log size`` added to the scores, as proportional attention; a size of 0 is never pooled)."""
        s = self.score(x)
        if size is not None:
            s = s + size.log()
        return (s.softmax(dim=1) * x).sum(dim=1)

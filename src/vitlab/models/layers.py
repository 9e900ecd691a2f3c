"""Building blocks of the Vision Transformer (Dosovitskiy et al., 2021, Sec. 3.1).

Module and parameter names follow timm (``patch_embed.proj``, ``attn.qkv``,
``mlp.fc1`` ...) because parameter names are API: they let the world's weights
load without a rename table.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, InputError
from . import fused_block, onednn

__all__ = ["Attention", "Block", "DropPath", "Mlp", "PatchEmbed", "make_act"]


def make_act(name: str) -> nn.Module:
    """GELU as in the paper: ``gelu`` is exact (timm, HF), ``gelu_tanh`` the
    tanh approximation used by the official JAX code (``flax.linen.gelu``)."""
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "relu":
        return nn.ReLU()
    raise ConfigError(f"unknown activation {name!r}; choose 'gelu', 'gelu_tanh' or 'relu'")


class PatchEmbed(nn.Module):
    """Eq. 1's ``x_p E``: cut the image into P x P patches, flatten, project to D.

    A convolution with kernel = stride = P is exactly the linear projection of
    the flattened patches (weights laid out as ``(D, C, P, P)``), and is what
    timm and the official code store.
    """

    def __init__(self, *, patch_size: int, in_chans: int, embed_dim: int, dynamic_pad: bool = False) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.in_chans = in_chans
        self.dynamic_pad = dynamic_pad
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid (rows, columns) for an input of this size."""
        p = self.patch_size
        if self.dynamic_pad:
            return math.ceil(height / p), math.ceil(width / p)
        return height // p, width // p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, N, D)`` with N = HW / P^2, patches in row-major order."""
        if x.ndim != 4:
            raise InputError(f"expected an image batch of shape (B, C, H, W), got shape {tuple(x.shape)}")
        _, c, h, w = x.shape
        if c != self.in_chans:
            raise InputError(
                f"the model takes {self.in_chans}-channel images, got {c} channels (input shape {tuple(x.shape)})"
            )
        p = self.patch_size
        if h % p or w % p:
            if not self.dynamic_pad:
                raise InputError(
                    f"image size {h}x{w} is not divisible by the patch size {p}; resize to a multiple of {p} "
                    f"(e.g. {max(p, h // p * p)}x{max(p, w // p * p)}) or build the model with dynamic_img_pad=True"
                )
            x = F.pad(x, (0, (-w) % p, 0, (-h) % p))
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention (MSA, Eq. 2 and Appendix A).

    The fast path calls ``F.scaled_dot_product_attention``. With
    ``return_attn=True`` the softmax weights are computed explicitly (same
    maths, no fused kernel) and returned, so analyses never get ``None``.
    """

    def __init__(
        self, *, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ConfigError(f"width {dim} is not divisible by the number of heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self, x: torch.Tensor, *, return_attn: bool = False, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``residual`` (Block's CPU inference path, after :func:`onednn.applies`) is added to
        the output inside the projection's GEMM, and qkv runs on oneDNN too."""
        b, n, d = x.shape
        fused = residual is not None
        qkv = onednn.linear(self.qkv, x) if fused else self.qkv(x)
        qkv = qkv.view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn: torch.Tensor | None = None
        drop = self.attn_drop if self.training else 0.0
        if return_attn:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1)
            out = F.dropout(attn, p=drop, training=self.training) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
        out = out.transpose(1, 2).reshape(b, n, d)
        if fused:
            return onednn.linear(self.proj, out, residual=residual), attn
        return self.proj_drop(self.proj(out)), attn


class Mlp(nn.Module):
    """The block's MLP: two layers with a GELU between (Sec. 3.1)."""

    def __init__(self, *, dim: int, hidden_dim: int, act: str = "gelu", drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = make_act(act)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, *, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``residual`` (Block's CPU inference path, after :func:`onednn.applies`) is added to
        the output inside fc2's GEMM; the GELU rides in fc1's."""
        if residual is not None:
            return onednn.linear(self.fc2, onednn.linear(self.fc1, x, act=self.act), residual=residual)
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth (Huang et al., 2016): drop a whole residual branch per sample."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def scale(self, x: torch.Tensor) -> torch.Tensor | None:
        """The per-sample factor for a batch like ``x`` (0 or 1/keep, shaped to broadcast), drawn
        from the global RNG; None when nothing is dropped (p = 0 or eval). The fused training
        block (models/fused_block.py) draws its masks here too."""
        if self.p == 0.0 or not self.training:
            return None
        keep = 1.0 - self.p
        return x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep).div_(keep)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scale(x)
        return x if s is None else x * s

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Block(nn.Module):
    """One pre-LayerNorm Transformer encoder layer, Eq. 2-3:

    ``z' = MSA(LN(z)) + z`` and ``z = MLP(LN(z')) + z'``.
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
        attn_layer: Callable[..., nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        attn_cls = attn_layer or Attention
        self.attn = attn_cls(dim=dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim=dim, hidden_dim=mlp_dim, act=act, drop=drop)
        self.drop_path2 = DropPath(drop_path)
        self.workspace = fused_block.Workspace()
        """Activation buffers the fused CPU training path reuses between steps (models/fused_block.py)."""
        self.scratch = fused_block.Scratch()
        """Its backward's temporaries; a model's blocks share one (``fused_block.share_scratch``)."""

    def train(self, mode: bool = True) -> Block:
        if mode:  # inference-only packed weights (models/onednn.py) would go stale and hold memory
            onednn.forget(self)
        else:  # nor are the training path's buffers needed in eval
            self.workspace.clear()
            self.scratch.clear()
        return super().train(mode)

    def forward(self, x: torch.Tensor, *, return_attn: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not return_attn and isinstance(self.attn, Attention) and onednn.applies(self, x):
            # Inference (eval: no dropout, no drop-path): biases, GELU and both residual
            # adds ride in the GEMM epilogues, see models/onednn.py.
            x, _ = self.attn(self.norm1(x), residual=x)
            return self.mlp(self.norm2(x), residual=x), None
        if not return_attn and fused_block.applies(self, x):
            # CPU training: the whole block as one autograd node, see models/fused_block.py.
            return fused_block.block_forward(self, x), None
        y, attn = self.attn(self.norm1(x), return_attn=return_attn)
        x = x + self.drop_path1(y)
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return x, attn

    def forward_cls(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output for the first (class) token only: ``(B, T, D)`` -> ``(B, 1, D)``.

        Eq. 2-3 mix tokens only inside attention, so the class token's output needs the keys and
        values of every token but the query, the projection and the MLP of the class token
        alone. As the last block under class-token pooling this computes what ``self(x)[0][:, :1]``
        does with a quarter of the work or less (the K and V projections); see
        ``VisionTransformer.forward``. Same maths, float32 rounding aside."""
        attn = self.attn
        if type(attn) is not Attention:
            raise ConfigError(f"forward_cls needs the plain Attention layer, not {type(attn).__name__}")
        b, t, d = x.shape
        xn = self.norm1(x)
        w, bias = attn.qkv.weight, attn.qkv.bias
        q = F.linear(xn[:, :1], w[:d], None if bias is None else bias[:d]).view(b, 1, attn.num_heads, attn.head_dim)
        kv = F.linear(xn, w[d:], None if bias is None else bias[d:]).view(b, t, 2, attn.num_heads, attn.head_dim)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)
        drop = attn.attn_drop if self.training else 0.0
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, dropout_p=drop).transpose(1, 2).reshape(b, 1, d)
        x = x[:, :1] + self.drop_path1(attn.proj_drop(attn.proj(o)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))

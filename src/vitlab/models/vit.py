"""The Vision Transformer, Eq. 1-4 of Dosovitskiy et al. (2021), as one class.

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos          (1)
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                      (2)
    z_l = MLP(LN(z'_l)) + z'_l                             (3)
    y = LN(z_L^0)                                          (4)

:class:`VisionTransformer` reads top-down like the paper: ``embed`` computes (1), ``encode`` (2)-(3) and the
final LayerNorm, ``pool`` picks z_L^0 (or averages the patch tokens for ``gap``), ``forward_head`` applies the
classification head. One block loop (:meth:`VisionTransformer.encode`) serves the logits, the features and every
intermediate an analysis asks for (:meth:`VisionTransformer.forward_intermediates`).

Then, as methods of the same class, what the model does besides Eq. 1-4:

- loading a checkpoint trained at another resolution (Sec. 3.2: "we perform 2D interpolation of the pre-trained
  position embeddings"): ``load_state_dict`` resamples the position embeddings to this model's grid
  (:meth:`~VisionTransformer.adapt_state_dict`, with :func:`.posemb.resample_posemb`);
- packed input (NaViT): ``model(packed)`` for :class:`~.packed.PackedPatches`, the packing and the
  block-diagonal attention in :mod:`.packed`;
- token merging (ToMe): :meth:`~VisionTransformer.set_tome`, the matching and merging in :mod:`.tome`;
- timm's model API (``pretrained_cfg``, ``reset_classifier``, ``forward_head``, ``group_matcher`` ...), so code
  written for ``timm.models.VisionTransformer`` runs on it; timm's names for configs in :mod:`.timm_api`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import ConfigError
from .axial import AxialBlock
from .config import ViTConfig
from .flops import block_macs, count_macs
from .hybrid import ConvTokenizer, HybridEmbed
from .layers import Block, LayerScale, MAPHead, PatchDropout, PatchEmbed, SeqPool, SwiGLU
from .packed import PackedAttention, PackedPatches, unpack
from .packed import check as check_packed
from .posemb import grid_of, patch_posemb_table, resample_1d, resample_posemb
from .room import check_buildable
from .timm_api import TIMM_POOL, pool_name, pretrained_cfg
from .tome import check as check_tome
from .tome import encode as tome_encode
from .tome import merge_schedule, weighted_mean

__all__ = ["VisionTransformer"]


class VisionTransformer(nn.Module):
    """ViT with timm's parameter names.

    Build it from a :class:`ViTConfig`, keyword overrides, or both::

        VisionTransformer(ViTConfig(depth=6), num_classes=10)
        VisionTransformer(embed_dim=192, depth=12, num_heads=3, mlp_dim=768)

    ``block_fn`` builds the encoder blocks instead of :class:`Block` (same keyword arguments),
    as in timm. Any input size whose sides the patch size divides is accepted at run time;
    learned position embeddings are then resampled on the fly (``posemb_resample``), and ``load_state_dict``
    takes a checkpoint trained at another resolution (Sec. 3.2). Images of several shapes at once come packed
    (:class:`~.packed.PackedPatches`: ``model(packed)`` gives one row per image).
    """

    tome_r: int = 0
    """Patch tokens merged in each block (capped by :func:`~.tome.merge_schedule`); 0: off, the exact model."""
    packed_attention: str = "split"
    """How attention stays within each packed image: one of :data:`~.packed.ATTENTION_METHODS`
    (:class:`~.packed.PackedAttention`)."""

    def __init__(
        self, config: ViTConfig | None = None, /, *, block_fn: type[nn.Module] | None = None, **overrides: Any
    ) -> None:
        super().__init__()
        cfg = (config or ViTConfig()).replace(**overrides) if overrides else (config or ViTConfig())
        check_buildable(cfg)  # by arithmetic, before any module: a depth of 100,000 is one line, not a dying machine
        self.config = cfg
        d = cfg.embed_dim
        self.num_prefix_tokens = cfg.num_prefix_tokens
        # Eq. 1: patch embedding E (or a ResNet stem, Sec. 3.1 "Hybrid"), class token, E_pos
        self.patch_embed = self._make_stem(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, d)) if cfg.dist_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, d)) if cfg.reg_tokens else None
        gh, gw = cfg.grid_size
        if cfg.posemb == "learn":
            self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + gh * gw, d))
        elif cfg.posemb == "learn2d":
            self.pos_embed_row = nn.Parameter(torch.zeros(1, gh, d // 2))
            self.pos_embed_col = nn.Parameter(torch.zeros(1, gw, d - d // 2))
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        # training only: a random subset of the patch tokens goes on (PatchDropout, Liu et al. 2022)
        self.patch_drop = (
            PatchDropout(cfg.patch_drop_rate, num_prefix_tokens=self.num_prefix_tokens)
            if cfg.patch_drop_rate > 0
            else nn.Identity()
        )
        self.norm_pre = nn.LayerNorm(d, eps=cfg.norm_eps) if cfg.pre_norm else nn.Identity()  # CLIP
        # Eq. 2-3: L encoder blocks, stochastic depth growing linearly with depth
        dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.ModuleList(self._make_block(cfg, dpr[i], block_fn) for i in range(cfg.depth))
        # Eq. 4: final LayerNorm (after pooling with timm's fc_norm), then the head
        use_fc_norm = cfg.pool == "gap" and cfg.fc_norm
        self.norm = nn.Identity() if use_fc_norm else nn.LayerNorm(d, eps=cfg.norm_eps)
        self.fc_norm = nn.LayerNorm(d, eps=cfg.norm_eps) if use_fc_norm else nn.Identity()
        self.attn_pool = self._make_map_head(cfg) if cfg.pool == "map" else None
        self.seq_pool = SeqPool(d) if cfg.pool == "seq" else None
        self.head_drop = nn.Dropout(cfg.drop_rate)
        if cfg.head == "mlp":  # pre-training: one hidden tanh layer (Sec. 3.1)
            self.pre_logits = nn.Sequential()
            self.pre_logits.add_module("fc", nn.Linear(d, cfg.pre_logits_dim))
            self.pre_logits.add_module("act", nn.Tanh())
        else:  # fine-tuning: a single (zero-initialised) linear layer
            self.pre_logits = nn.Identity()
        self.head = nn.Linear(cfg.pre_logits_dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.head_dist = self._make_dist_head(cfg.num_classes) if cfg.dist_token else None
        self.distilled_training = False
        """With a distillation token, training forwards return (class logits, distillation logits)."""
        self._captured: list[torch.Tensor] | None = None
        self.grad_checkpointing = False
        """Recompute each block in the backward pass instead of storing its activations (training only)."""
        self.init_weights()

    # -- construction (the hybrid and axial variants differ here) ----------------
    def _make_stem(self, cfg: ViTConfig) -> nn.Module:
        if cfg.stem == "conv":
            return ConvTokenizer(
                layers=cfg.stem_layers, width=cfg.stem_width, in_chans=cfg.in_chans, embed_dim=cfg.embed_dim
            )
        if cfg.hybrid_layers is not None:
            return HybridEmbed(
                layers=cfg.hybrid_layers, patch_size=cfg.patch_size, in_chans=cfg.in_chans, embed_dim=cfg.embed_dim
            )
        return PatchEmbed(
            patch_size=cfg.patch_size,
            in_chans=cfg.in_chans,
            embed_dim=cfg.embed_dim,
            dynamic_pad=cfg.dynamic_img_pad,
            bias=not cfg.pre_norm,
        )

    def _make_dist_head(self, num_classes: int) -> nn.Module:
        d = self.config.embed_dim
        return nn.Linear(d, num_classes) if num_classes > 0 else nn.Identity()

    @staticmethod
    def _make_map_head(cfg: ViTConfig) -> MAPHead:
        return MAPHead(
            dim=cfg.embed_dim,
            num_heads=cfg.map_heads or cfg.num_heads,
            mlp_dim=cfg.map_mlp_dim or cfg.mlp_dim,
            qkv_bias=cfg.qkv_bias,
            act=cfg.act,
            norm_eps=cfg.norm_eps,
        )

    def _make_block(self, cfg: ViTConfig, drop_path: float, block_fn: type[nn.Module] | None) -> nn.Module:
        if block_fn is None:
            block_fn = AxialBlock if cfg.attention == "axial" else Block
        return block_fn(
            dim=cfg.embed_dim,
            num_heads=cfg.num_heads,
            mlp_dim=cfg.mlp_dim,
            qkv_bias=cfg.qkv_bias,
            act=cfg.act,
            drop=cfg.drop_rate,
            attn_drop=cfg.attn_drop_rate,
            drop_path=drop_path,
            norm_eps=cfg.norm_eps,
            init_values=cfg.init_values,
            qk_norm=cfg.qk_norm,
            **({"rope_theta": cfg.rope_theta} if cfg.rope else {}),
            **self._block_options(cfg),
        )

    @staticmethod
    def _block_options(cfg: ViTConfig) -> dict[str, Any]:
        """The block's keyword arguments for the options after the paper's (passed only when set, so that a
        ``block_fn`` written for the paper's block keeps working): RoPE's convention, q/v-only biases, the
        NormFormer norms and the SwiGLU MLP."""
        attn: dict[str, Any] = {}
        if cfg.rope and cfg.rope_kind != "axial":
            attn.update(rope_kind=cfg.rope_kind, rope_ref_grid=cfg.rope_ref_grid, rope_offset=cfg.rope_offset)
        if cfg.qkv_bias and not cfg.key_bias:
            attn["key_bias"] = False
        if cfg.attn_norm:
            attn["attn_norm"] = True
        out: dict[str, Any] = {"attn_options": attn} if attn else {}
        if cfg.mlp == "swiglu":
            out["mlp_layer"] = SwiGLU
        if cfg.mlp_norm:
            out["mlp_norm"] = True
        return out

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialisation of the official JAX code: Xavier-uniform dense kernels,
        LeCun-normal patch projection, N(0, 0.02) position embeddings, zero class
        token, MLP biases N(0, 1e-6), and a zero-initialised classifier head."""
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    if name.endswith(("mlp.fc1", "mlp.fc2")):
                        nn.init.normal_(m.bias, std=1e-6)
                    else:
                        nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, LayerScale):
                nn.init.constant_(m.gamma, m.init_values)
        proj = getattr(self.patch_embed, "proj", None)
        if isinstance(proj, nn.Conv2d):
            fan_in = proj.in_channels * proj.kernel_size[0] * proj.kernel_size[1]
            nn.init.trunc_normal_(proj.weight, std=math.sqrt(1.0 / fan_in) / 0.87962566103423978)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
        for p in (
            getattr(self, "pos_embed", None),
            getattr(self, "pos_embed_row", None),
            getattr(self, "pos_embed_col", None),
        ):
            if p is not None:
                nn.init.normal_(p, std=0.02)
        if self.dist_token is not None:
            nn.init.trunc_normal_(self.dist_token, std=0.02)
        if isinstance(self.head_dist, nn.Linear):
            nn.init.zeros_(self.head_dist.weight)
            nn.init.zeros_(self.head_dist.bias)
        if self.reg_token is not None:  # as timm: near zero, told apart by their position embeddings
            nn.init.normal_(self.reg_token, std=1e-6)
        if self.attn_pool is not None:
            nn.init.trunc_normal_(self.attn_pool.latent, std=self.config.embed_dim**-0.5)
        if self.seq_pool is not None:  # as CCT
            nn.init.trunc_normal_(self.seq_pool.score.weight, std=0.02)
        if isinstance(self.patch_embed, ConvTokenizer):
            self.patch_embed.reset_parameters()
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    # -- Eq. 1: the embedded sequence z_0 ----------------------------------------
    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 1: patch embedding, class token, position embedding -> ``(B, T, D)``."""
        return self.embed_tokens(self.patch_embed(x), self.grid(x))

    def grid(self, x: torch.Tensor) -> tuple[int, int]:
        """The patch grid (rows, columns) of the image batch ``x``."""
        return self.patch_embed.grid(x.shape[-2], x.shape[-1])

    def embed_tokens(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """The rest of Eq. 1 for already projected patches ``(B, N, D)``: add position
        embeddings, prepend the class token. Objectives that corrupt patch
        embeddings (masked patch prediction, Sec. 4.6) enter here. In training with ``patch_drop_rate``
        only a random subset of the patch tokens comes out (:class:`~.layers.PatchDropout`)."""
        cfg = self.config
        pe = self.patch_posemb(grid, like=tokens)
        if pe is not None:
            tokens = tokens + pe
        prefix = [t for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if prefix:
            pre = torch.cat(prefix, dim=1).expand(tokens.shape[0], -1, -1)
            if cfg.posemb == "learn":  # their own rows of E_pos
                pre = pre + self.pos_embed[:, : self.num_prefix_tokens]
            tokens = torch.cat([pre, tokens], dim=1)
        return self.norm_pre(self.patch_drop(self.pos_drop(tokens)))

    def patch_posemb(self, grid: tuple[int, int], *, like: torch.Tensor | None = None) -> torch.Tensor | None:
        """E_pos of the patch tokens of a ``grid`` (``(1, N, D)``, in ``like``'s dtype and device for
        the fixed sine-cosine table), or None for a model without position embeddings."""
        cfg = self.config
        if cfg.posemb == "none":
            return None
        if like is None:  # any parameter: the table takes its device and dtype
            like = next(self.parameters())
        tables = {"learn": ("pos_embed",), "learn2d": ("pos_embed_row", "pos_embed_col")}.get(cfg.posemb, ())
        args = (cfg.posemb, cfg.grid_size, cfg.posemb_resample, self.num_prefix_tokens, cfg.embed_dim)
        return patch_posemb_table(like, grid, *args, *(getattr(self, n) for n in tables))

    # -- Eq. 2-3 and the final LayerNorm: the one block loop ---------------------
    def encode(
        self,
        z: torch.Tensor,
        grid: tuple[int, int],
        *,
        attention: bool = False,
        keep: bool = False,
        packing: PackedAttention | None = None,
    ) -> dict[str, Any]:
        """Run the encoder on an embedded sequence ``z_0``: ``encoded`` (``(B, T, D)``, after the
        final LayerNorm); with ``attention`` also each layer's weights, with ``keep`` each
        block's output z_1 .. z_L (``blocks``); ``packing``: attention within each packed image (:mod:`.packed`)."""
        out: dict[str, Any] = {"blocks": [], "attention": []}
        if self.tome_r:  # token merging (.tome): fewer tokens from block to block, each with its size
            if attention or keep:
                raise ConfigError("token merging is on (set_tome): attention maps and intermediates need every token")
            z, out["token_size"] = tome_encode(self.blocks, z, r=self.tome_r, prefix=self.num_prefix_tokens)
            out["encoded"] = self.norm(z)
            return out
        recompute = self.grad_checkpointing and self.training and torch.is_grad_enabled() and not attention
        kw: dict[str, Any] = {"grid": grid} if self.config.attention == "axial" else {}
        if self.config.rope:  # one table for every block (each has its RotaryPosition2D)
            cos, sin = self.blocks[0].attn.rope.table(grid, device=z.device)
            kept = getattr(self.patch_drop, "kept", None)
            if (
                self.training
                and kept is not None
                and z.shape[:2] == (kept.shape[0], self.num_prefix_tokens + kept.shape[1])
            ):
                cos, sin = cos[kept], sin[kept]  # token dropping: each kept patch keeps its place, (B, kept, hd)
            kw["rope"] = (cos, sin)
        if packing is not None:
            kw["packing"] = packing
        for blk in self.blocks:
            if attention:
                z, a = blk(z, return_attention=True, **kw)
                out["attention"].append(a)
            elif recompute:  # activation checkpointing: memory for compute, same gradients
                z = checkpoint(blk, z, use_reentrant=False, **kw)
            else:
                z = blk(z, **kw)
            if keep:
                out["blocks"].append(z)
        out["encoded"] = self.norm(z)
        return out

    def forward_features(
        self, x: torch.Tensor | PackedPatches, *, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Eq. 1-3 and the final LayerNorm: ``(B, C, H, W)`` -> ``(B, T, D)``.

        With ``return_attention=True`` also returns each layer's attention
        weights ``(B, heads, T, T)``, computed exactly (no fused kernel).
        """
        if isinstance(x, PackedPatches):  # (B, S, D), each image's tokens where the packing put them
            return self.encode_packed(x)["encoded"]
        want = return_attention or self._captured is not None
        out = self.encode(self.embed(x), self.grid(x), attention=want)
        if self._captured is not None:
            self._captured.extend(out["attention"])
        return (out["encoded"], out["attention"]) if return_attention else out["encoded"]

    # -- Eq. 4 and the head --------------------------------------------------------
    def pool(self, x: torch.Tensor, token_size: torch.Tensor | None = None) -> torch.Tensor:
        """z_L^0 for ``cls``; the mean of the patch tokens for ``gap``; attention pooling of the patch
        tokens for ``map`` (as timm: class and register tokens are not pooled, unless ``pool_include_prefix``,
        as the Perception Encoder's), sequence pooling of them for ``seq``. ``token_size``: the tokens' sizes
        after token merging (:mod:`.tome`), which weigh them."""
        if self.config.pool == "cls":
            return x[:, 0]
        p = 0 if self.config.pool_include_prefix else self.num_prefix_tokens
        size = None if token_size is None else token_size[:, p:]
        if self.attn_pool is not None:
            return self.attn_pool(x[:, p:], size)
        if self.seq_pool is not None:
            return self.seq_pool(x[:, p:], size)
        return x[:, p:].mean(dim=1) if size is None else weighted_mean(x[:, p:], size)

    def forward_head(
        self, x: torch.Tensor, *, pre_logits: bool = False, token_size: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Pool the encoded tokens (of sizes ``token_size`` after token merging) and classify;
        ``pre_logits=True`` stops before the classifier."""
        if self.head_dist is not None:  # DeiT: class token -> head, distillation token -> head_dist
            x, x_dist = self.head_drop(x[:, 0]), self.head_drop(x[:, 1])
            if pre_logits:
                return (x + x_dist) / 2
            x, x_dist = self.head(x), self.head_dist(x_dist)
            if self.distilled_training and self.training:
                return x, x_dist  # type: ignore[return-value]
            return (x + x_dist) / 2
        x = self.fc_norm(self.pool(x, token_size))
        x = self.pre_logits(self.head_drop(x))
        return x if pre_logits else self.head(x)

    def forward(
        self, x: torch.Tensor | PackedPatches, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits ``(B, num_classes)``; with ``return_attention`` also the per-layer attention weights.

        ``return_attention`` may be passed by position: PyTorch's TorchScript-based ONNX exporter
        (``torch.onnx.export(..., dynamo=False)``) appends every defaulted parameter positionally.
        Packed images (:class:`~.packed.PackedPatches`) give ``(images, num_classes)``."""
        if isinstance(x, PackedPatches):
            return self.forward_packed(x, return_attention=return_attention is True)
        if return_attention is True:  # `is`: a symbolic trace (torch.fx) passes a proxy for the flag
            feats, attns = self.forward_features(x, return_attention=True)  # type: ignore[misc]
            return self.forward_head(feats), attns
        if self.tome_r:  # merged tokens: pooling weighs them by their sizes
            out = self.encode(self.embed(x), self.grid(x), attention=self._captured is not None)
            return self.forward_head(out["encoded"], token_size=out["token_size"])
        return self.forward_head(self.forward_features(x))  # type: ignore[arg-type]

    # -- Sec. 3.2: a checkpoint trained at another resolution ---------------------
    def adapt_state_dict(self, state_dict: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        """Resample, in place, position embeddings stored for another (square) grid to this
        model's grid (Sec. 3.2); other tensors are left alone. Returns ``state_dict``."""
        cfg = self.config
        key = prefix + "pos_embed"
        if cfg.posemb == "learn" and key in state_dict:
            pe = state_dict[key]
            if pe.ndim == 3 and pe.shape[1] != self.pos_embed.shape[1] and pe.shape[-1] == cfg.embed_dim:
                n_prefix = self.num_prefix_tokens
                old = pe.shape[1] - n_prefix
                if old > 0 and math.isqrt(old) ** 2 == old:
                    state_dict[key] = resample_posemb(
                        pe, cfg.grid_size, old_grid=grid_of(old), num_prefix_tokens=n_prefix, mode=cfg.posemb_resample
                    )  # type: ignore[arg-type]
        for axis, n in (("row", cfg.grid_size[0]), ("col", cfg.grid_size[1])):
            k = f"{prefix}pos_embed_{axis}"
            if cfg.posemb == "learn2d" and k in state_dict and state_dict[k].ndim == 3 and state_dict[k].shape[1] != n:
                state_dict[k] = resample_1d(state_dict[k], n, mode=cfg.posemb_resample)  # type: ignore[arg-type]
        return state_dict

    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: int | None = None) -> None:
        """timm's ``set_input_size``: from now on the model's resolution is ``img_size`` (and its patch
        ``patch_size``): learned position embeddings resampled to the new grid in 2-D, as a checkpoint of another
        resolution loads (Sec. 3.2); the patch projection of a new patch size resampled by FlexiViT's PI-resize
        (:func:`.flexi.resample_patch_embed`, a plain patch embedding only); the config, and so
        ``pretrained_cfg``, follow. (Other sizes were taken before too, resampled at each call.)"""
        from .flexi import resample_patch_embed

        cfg = self.config
        new = cfg.replace(
            img_size=cfg.img_size if img_size is None else img_size,
            patch_size=cfg.patch_size if patch_size is None else patch_size,
        )
        if new.img_size != cfg.img_size:
            new = new.at_size(new.img_size)  # (an image processor's other side no longer applies)
        if new.patch_size != cfg.patch_size and (cfg.stem != "patch" or cfg.hybrid_layers is not None):
            raise ConfigError("patch_size: only a plain patch embedding is resampled to another patch size")
        check_buildable(new)
        if new.patch_size != cfg.patch_size:
            old = self.patch_embed
            self.patch_embed = self._make_stem(new).to(old.proj.weight)
            with torch.no_grad():
                self.patch_embed.proj.weight.copy_(resample_patch_embed(old.proj.weight, new.patch_size))
                if old.proj.bias is not None:
                    self.patch_embed.proj.bias.copy_(old.proj.bias)
        if cfg.posemb == "learn" and new.grid_size != cfg.grid_size:
            pe = resample_posemb(
                self.pos_embed.data, new.grid_size, old_grid=cfg.grid_size, num_prefix_tokens=self.num_prefix_tokens,
                mode=cfg.posemb_resample,
            )  # fmt: skip
            self.pos_embed = nn.Parameter(pe, requires_grad=self.pos_embed.requires_grad)
        elif cfg.posemb == "learn2d":
            for axis, n in (("row", new.grid_size[0]), ("col", new.grid_size[1])):
                table = getattr(self, f"pos_embed_{axis}")
                resampled = resample_1d(table.data, n, mode=cfg.posemb_resample)
                setattr(self, f"pos_embed_{axis}", nn.Parameter(resampled, requires_grad=table.requires_grad))
        self.config = new

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """``load_state_dict`` accepts checkpoints of another resolution: see :meth:`adapt_state_dict`."""
        self.adapt_state_dict(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # -- analyses: every stage of one forward -----------------------------------
    @contextlib.contextmanager
    def capture_attention(self) -> Iterator[list[torch.Tensor]]:
        """Context manager: every forward inside it appends each layer's exact
        attention weights to the yielded list::

            with model.capture_attention() as attns:
                model(images)
            # attns[l] is (B, heads, T, T)
        """
        captured: list[torch.Tensor] = []
        prev, self._captured = self._captured, captured
        try:
            yield captured
        finally:
            self._captured = prev

    def get_intermediate_layers(
        self,
        x: torch.Tensor,
        n: int | list[int] | tuple[int, ...] = 1,
        reshape: bool = False,
        return_prefix_tokens: bool = False,
        norm: bool = False,
    ) -> tuple[Any, ...]:
        """The patch tokens after the last ``n`` blocks (or the blocks at the indices ``n``), as timm and
        DINO return them: ``(B, N, D)`` each, ``(B, D, rows, cols)`` with ``reshape``, the final
        LayerNorm applied with ``norm``, paired with the prefix tokens with ``return_prefix_tokens``."""
        return tuple(self._intermediates(x, n, reshape, return_prefix_tokens, norm)[0])

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | tuple[int, ...] | None = None,
        *,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> Any:
        """Everything an analysis may want from one forward, in the spirit of big_vision's ``out``
        dict: ``stem`` (patch tokens), ``embedded`` (z_0), ``blocks`` (z_1 .. z_L),
        ``attention`` (per layer), ``encoded`` (after the final norm), ``pre_logits`` and ``logits``.

        With ``indices`` (the last ``n`` blocks, or a list of block indices) it answers as timm's
        ``forward_intermediates``: ``(encoded, [patch tokens after each chosen block])``, ``(B, D, rows,
        cols)`` for ``output_fmt="NCHW"`` or ``(B, N, D)`` for ``"NLC"``, only the list with
        ``intermediates_only``. (Without ``indices`` vitlab's dict is returned: timm returns all blocks.)"""
        if indices is not None:
            if output_fmt not in ("NCHW", "NLC"):
                raise ConfigError(f"output_fmt: {output_fmt!r} is not one of NCHW, NLC")
            feats, encoded = self._intermediates(x, indices, output_fmt == "NCHW", return_prefix_tokens, norm)
            return feats if intermediates_only else (encoded, feats)
        grid = self.grid(x)
        out: dict[str, Any] = {"stem": self.patch_embed(x)}
        z = out["embedded"] = self.embed_tokens(out["stem"], grid)
        out.update(self.encode(z, grid, attention=True, keep=True))
        out["pre_logits"] = self.forward_head(out["encoded"], pre_logits=True)
        out["logits"] = self.head(out["pre_logits"])
        return out

    def _intermediates(
        self, x: torch.Tensor, n: int | list[int] | tuple[int, ...], reshape: bool, prefix: bool, norm: bool
    ) -> tuple[list[Any], torch.Tensor]:
        """(the patch tokens after the chosen blocks, the encoded sequence): the one loop behind
        :meth:`get_intermediate_layers` and timm's form of :meth:`forward_intermediates`."""
        depth = len(self.blocks)
        if isinstance(n, int) and not 0 < n <= depth:
            raise ConfigError(f"n: {n} is not a number of blocks in 1..{depth}")
        indices = list(range(depth - n, depth)) if isinstance(n, int) else [i % depth for i in n]
        grid = self.grid(x)
        out = self.encode(self.embed(x), grid, keep=True)
        p = self.num_prefix_tokens
        feats = []
        for i in indices:
            z = self.norm(out["blocks"][i]) if norm else out["blocks"][i]
            tokens = z[:, p:]
            if reshape:
                tokens = tokens.reshape(z.shape[0], grid[0], grid[1], -1).permute(0, 3, 1, 2).contiguous()
            feats.append((tokens, z[:, :p]) if prefix else tokens)
        return feats, out["encoded"]

    # -- packed input (NaViT): images of any shapes in one sequence (.packed) ------
    def embed_packed(self, packed: PackedPatches) -> torch.Tensor:
        """Eq. 1 for each packed image: ``(B, S, D)``, each image's segment ``[prefix tokens; x_p E] + E_pos``,
        zeros at padding."""
        return self._embed_packed(packed, check_packed(self, packed)[0])

    def _embed_packed(self, packed: PackedPatches, start: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        proj = self.patch_embed.proj
        tokens = F.linear(packed.patches, proj.weight.flatten(1), proj.bias)
        ids = packed.image_ids.reshape(-1)
        valid = ids >= 0
        img = ids.clamp(min=0)
        patch = (packed.rows.reshape(-1) >= 0)[:, None]
        d = tokens.shape[-1]
        # E_pos of each patch token: the tables of the images' distinct grids end to end, and a zero row
        pe = torch.zeros(1, d, dtype=tokens.dtype, device=tokens.device)
        row = torch.zeros_like(ids)
        if cfg.posemb != "none":
            grids, which = torch.unique(packed.grids, dim=0, return_inverse=True)
            tables = [self.patch_posemb((int(h), int(w)), like=tokens)[0] for h, w in grids.tolist()]
            sizes = grids[:, 0] * grids[:, 1]
            offsets = torch.cumsum(sizes, 0) - sizes
            pe = torch.cat([*tables, pe.to(tables[0].dtype)])
            at = offsets[which[img]] + packed.rows.reshape(-1) * packed.grids[img, 1] + packed.cols.reshape(-1)
            row = torch.where(patch[:, 0], at, len(pe) - 1)
        # the prefix tokens (each with its row of E_pos for the 1-D learned table), and a zero row
        p = self.num_prefix_tokens
        pre_rows = [t[0] for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        pre = torch.cat(pre_rows) if pre_rows else tokens.new_zeros(0, d)
        if p and cfg.posemb == "learn":
            pre = pre + self.pos_embed[0, :p]
        pre = torch.cat([pre, pre.new_zeros(1, d)])
        slot = torch.arange(ids.numel(), device=ids.device) - start[img]
        slot = torch.where(valid & ~patch[:, 0], slot, p)
        # (rows looked up as embeddings: an indexing gather's backward into a table of a few rows is far slower on a
        # CPU; docs/training.md, "Packing")
        z = torch.where(patch, tokens.reshape(-1, d) + F.embedding(row, pe), F.embedding(slot, pre))
        return self.norm_pre(self.pos_drop(z.view(tokens.shape)))

    def encode_packed(self, packed: PackedPatches, *, attention: bool = False) -> dict[str, Any]:
        """Eq. 1-3 and the final LayerNorm on packed images: ``encoded`` ``(B, S, D)``, ``start`` and ``length``
        of each image's tokens; with ``attention``, each layer's (block-diagonal) weights ``(B, heads, S, S)``."""
        start, length = check_packed(self, packed)
        z = self._embed_packed(packed, start)
        packing = PackedAttention(packed.image_ids, self.packed_attention)
        out = self.encode(z, self.config.grid_size, attention=attention, packing=packing)
        return {**out, "start": start, "length": length}

    def forward_packed(self, packed: PackedPatches, *, pre_logits: bool = False, return_attention: bool = False) -> Any:
        """Logits ``(n, classes)`` of the packed images (pooled features with ``pre_logits``); with
        ``return_attention`` also each layer's attention weights over the packed sequences."""
        want = return_attention or self._captured is not None
        out = self.encode_packed(packed, attention=want)
        if self._captured is not None:
            self._captured.extend(out["attention"])
        x, size = unpack(out["encoded"], out["start"], out["length"])
        y = self.forward_head(x, pre_logits=pre_logits, token_size=size)
        return (y, out["attention"]) if return_attention else y

    # -- token merging (ToMe): an inference option (.tome) -------------------------
    def set_tome(self, r: int) -> Any:
        """Merge ``r`` patch tokens in each block from now on (0 turns it off); returns the model. Refused for
        axial attention, rotary positions and replaced blocks. Analyses that need every token (attention maps,
        intermediates) refuse to run while it is on."""
        self.tome_r = check_tome(self, r)
        return self

    def tome_schedule(self, img_size: tuple[int, int] | None = None, *, r: int | None = None) -> list[int]:
        """Tokens merged per block at ``img_size`` (default: the model's) with ``r`` (default: the model's)."""
        gh, gw = self.patch_embed.grid(*(img_size or self.config.img_size))
        return merge_schedule(gh * gw, len(self.blocks), self.tome_r if r is None else r)

    def tome_macs(self, img_size: tuple[int, int] | None = None, *, r: int | None = None) -> int:
        """Multiply-accumulates of a forward with token merging at ``r`` (default: the model's), as
        :func:`~.flops.count_macs` counts: each block's attention at its input length, its MLP at the merged
        length."""
        cfg = self.config
        size = img_size or cfg.img_size
        gh, gw = self.patch_embed.grid(*size)
        t0 = t = gh * gw + cfg.num_prefix_tokens
        macs = count_macs(cfg, size)
        for k in self.tome_schedule(size, r=r):
            macs += block_macs(cfg, t) - block_macs(cfg, t0) - 2 * k * cfg.embed_dim * cfg.mlp_dim
            t -= k
        return macs

    # -- timm's model API: timm's names for what the model has -------------------
    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's ``pretrained_cfg`` (:func:`.timm_api.pretrained_cfg`), built from the model's config each time it is
        read, so it follows the config (a new head, another ``img_size``)."""
        return pretrained_cfg(self.config)

    @property
    def default_cfg(self) -> dict[str, Any]:
        """timm's older name for :attr:`pretrained_cfg`."""
        return self.pretrained_cfg

    @property
    def num_features(self) -> int:
        """Width of the features ``forward_features`` returns per token (timm's ``num_features``)."""
        return self.config.embed_dim

    @property
    def embed_dim(self) -> int:
        """The width D of every token (timm's ``embed_dim``)."""
        return self.config.embed_dim

    @property
    def head_hidden_size(self) -> int:
        """Width of what the classifier reads (``forward_head(pre_logits=True)``)."""
        return self.config.pre_logits_dim

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    @property
    def global_pool(self) -> str:
        """The pooling in timm's words: ``token`` (the class token), ``avg`` or ``map`` (``seq``: ours only)."""
        return TIMM_POOL.get(self.config.pool, self.config.pool)

    def get_classifier(self) -> nn.Module | tuple[nn.Module, nn.Module]:
        """The classifier; with a distillation token ``(head, head_dist)``, as timm."""
        return self.head if self.head_dist is None else (self.head, self.head_dist)

    def set_distilled_training(self, enable: bool = True) -> None:
        """Training forwards return both heads' logits, for the DeiT loss (a distillation token only)."""
        self.distilled_training = bool(enable)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh zero-initialised classifier for ``num_classes`` (0: none, ``forward`` returns the
        pooled features), and optionally another pooling (timm's names ``token``/``avg`` or ours)."""
        changes: dict[str, Any] = {"num_classes": num_classes, "class_names": None}
        if global_pool is not None:
            changes["pool"] = pool_name(global_pool)
            trained = {"map": self.attn_pool, "seq": self.seq_pool}
            if changes["pool"] in trained and trained[changes["pool"]] is None:
                raise ConfigError(
                    f"global_pool: {changes['pool']!r} needs a model built with it (its pooling is trained)"
                )
        self.config = self.config.replace(**changes)
        if self.config.pool != "map":
            self.attn_pool = None
        if self.config.pool != "seq":
            self.seq_pool = None
        ref = self.patch_embed.proj.weight if hasattr(self.patch_embed, "proj") else next(self.parameters())
        if num_classes > 0:
            self.head = nn.Linear(self.config.pre_logits_dim, num_classes, device=ref.device, dtype=ref.dtype)
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
        else:
            self.head = nn.Identity()
        if self.head_dist is not None:
            self.head_dist = self._make_dist_head(num_classes).to(device=ref.device, dtype=ref.dtype)
            if num_classes > 0:
                nn.init.zeros_(self.head_dist.weight)
                nn.init.zeros_(self.head_dist.bias)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Activation checkpointing (``torch.utils.checkpoint`` per block) in training forwards."""
        self.grad_checkpointing = bool(enable)

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter groups by depth, as timm's ``group_matcher``: the embedding, then block i, then the
        final norm (the head is the last group), for layer-wise learning-rate decay."""
        return {
            "stem": r"^cls_token|^dist_token|^reg_token|^pos_embed|^patch_embed|^norm_pre",
            "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        }

    def no_weight_decay(self) -> set[str]:
        """Parameters excluded from weight decay besides norms and biases."""
        names = ("pos_embed", "cls_token", "dist_token", "reg_token", "pos_embed_row", "pos_embed_col")
        return {n for n in names if getattr(self, n, None) is not None}

    # -- accounting ---------------------------------------------------------------
    def num_params(self, *, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def macs(self, img_size: tuple[int, int] | int | None = None, *, executed: bool = False) -> int:
        """Multiply-accumulates of one forward pass (matmuls only, as fvcore/timm count). With
        ``executed``, those ``forward`` actually runs (the same here; a subclass that skips work
        counts less: token merging)."""
        if executed and self.tome_r:
            return self.tome_macs((img_size, img_size) if isinstance(img_size, int) else img_size)
        return count_macs(self.config, img_size)


# torch.fx (torchvision's feature extractor) records the lookup as one call: the choice of
# table and the resampling depend on the input's size, which a symbolic trace does not know.
torch.fx.wrap("patch_posemb_table")

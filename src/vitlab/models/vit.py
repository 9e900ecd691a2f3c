"""The Vision Transformer, Eq. 1-4 of Dosovitskiy et al. (2021).

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos          (1)
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                      (2)
    z_l = MLP(LN(z'_l)) + z'_l                             (3)
    y = LN(z_L^0)                                          (4)

``forward_features`` computes (1)-(3) and the final LayerNorm, ``pool`` picks
z_L^0 (or averages the patch tokens for ``gap``), ``forward_head`` applies the
classification head.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from . import fused_block, onednn
from .axial import AxialBlock
from .config import ViTConfig
from .hybrid import HybridEmbed, backbone_macs
from .layers import Attention, Block, PatchEmbed
from .posemb import grid_of, resample_1d, resample_posemb, sincos_2d

__all__ = ["INFERENCE_CHUNK_BYTES", "VisionTransformer"]

INFERENCE_CHUNK_BYTES = 24 * 2**20
"""Default bound on the widest activation of one inference chunk (see
:meth:`VisionTransformer.inference_chunk_size`): below glibc malloc's 32 MiB ceiling for
serving a request from its heap instead of fresh ``mmap``-ed (page-faulted) memory."""


class VisionTransformer(nn.Module):
    """ViT with timm's parameter names.

    Build it from a :class:`ViTConfig`, keyword overrides, or both::

        VisionTransformer(ViTConfig(depth=6), num_classes=10)
        VisionTransformer(embed_dim=192, depth=12, num_heads=3, mlp_dim=768)

    Any input size whose sides the patch size divides is accepted at run time;
    learned position embeddings are then resampled on the fly (``posemb_resample``).
    """

    def __init__(self, config: ViTConfig | None = None, /, **overrides: Any) -> None:
        super().__init__()
        cfg = (config or ViTConfig()).replace(**overrides) if overrides else (config or ViTConfig())
        self.config = cfg
        d = cfg.embed_dim
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.patch_embed = self._make_stem(cfg)

        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if cfg.class_token else None
        gh, gw = cfg.grid_size
        if cfg.posemb == "learn":
            self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + gh * gw, d))
        elif cfg.posemb == "learn2d":
            self.pos_embed_row = nn.Parameter(torch.zeros(1, gh, d // 2))
            self.pos_embed_col = nn.Parameter(torch.zeros(1, gw, d - d // 2))
        self.pos_drop = nn.Dropout(cfg.drop_rate)

        dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.ModuleList(self._make_block(cfg, dpr[i]) for i in range(cfg.depth))
        fused_block.share_scratch(self.blocks)  # their backwards run one at a time
        use_fc_norm = cfg.pool == "gap" and cfg.fc_norm
        self.norm = nn.Identity() if use_fc_norm else nn.LayerNorm(d, eps=cfg.norm_eps)
        self.fc_norm = nn.LayerNorm(d, eps=cfg.norm_eps) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        if cfg.head == "mlp":
            self.pre_logits = nn.Sequential()
            self.pre_logits.add_module("fc", nn.Linear(d, cfg.pre_logits_dim))
            self.pre_logits.add_module("act", nn.Tanh())
        else:
            self.pre_logits = nn.Identity()
        self.head = nn.Linear(cfg.pre_logits_dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self._captured: list[torch.Tensor] | None = None
        self.inference_chunk_bytes: int | None = INFERENCE_CHUNK_BYTES
        """Split gradient-free forwards into chunks of the batch whose widest activation stays
        under this many bytes; ``None`` turns it off. See :meth:`inference_chunk_size`."""
        self.cls_only_last_block = True
        """With class-token pooling, ``forward`` runs the last block for the class token only
        (:meth:`Block.forward_cls`): the logits need nothing else of it, and it skips about 3/4 of
        that block's work, in training and inference alike. ``forward_features`` still returns
        every token. Turn it off to make forward hooks on the last block or ``norm`` see all tokens."""
        self._sincos_cache: dict[tuple[int, int], torch.Tensor] = {}
        self.init_weights()

    # -- construction hooks (the hybrid and axial models override these) --------
    def _make_stem(self, cfg: ViTConfig) -> nn.Module:
        if cfg.hybrid_layers is not None:
            return HybridEmbed(
                layers=cfg.hybrid_layers, patch_size=cfg.patch_size, in_chans=cfg.in_chans, embed_dim=cfg.embed_dim
            )
        return PatchEmbed(
            patch_size=cfg.patch_size, in_chans=cfg.in_chans, embed_dim=cfg.embed_dim, dynamic_pad=cfg.dynamic_img_pad
        )

    def _make_block(self, cfg: ViTConfig, drop_path: float) -> nn.Module:
        block_cls = AxialBlock if cfg.attention == "axial" else Block
        return block_cls(
            dim=cfg.embed_dim,
            num_heads=cfg.num_heads,
            mlp_dim=cfg.mlp_dim,
            qkv_bias=cfg.qkv_bias,
            act=cfg.act,
            drop=cfg.drop_rate,
            attn_drop=cfg.attn_drop_rate,
            drop_path=drop_path,
            norm_eps=cfg.norm_eps,
        )

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
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    def no_weight_decay(self) -> set[str]:
        """Parameters excluded from weight decay besides norms and biases."""
        return {n for n in ("pos_embed", "cls_token", "pos_embed_row", "pos_embed_col") if hasattr(self, n)}

    # -- forward -----------------------------------------------------------------
    def _posemb_for(self, grid: tuple[int, int], x: torch.Tensor) -> torch.Tensor | None:
        """Position embeddings of the patch tokens for ``grid`` (``(1, N, D)``) or None."""
        cfg = self.config
        if cfg.posemb == "learn":
            pe = self.pos_embed[:, self.num_prefix_tokens :]
            if tuple(grid) != cfg.grid_size:
                pe = resample_posemb(pe, grid, old_grid=cfg.grid_size, num_prefix_tokens=0, mode=cfg.posemb_resample)  # type: ignore[arg-type]
            return pe
        if cfg.posemb == "learn2d":
            rows = resample_1d(self.pos_embed_row, grid[0], mode=cfg.posemb_resample)  # type: ignore[arg-type]
            cols = resample_1d(self.pos_embed_col, grid[1], mode=cfg.posemb_resample)  # type: ignore[arg-type]
            gh, gw = grid
            pe = torch.cat(
                [rows[:, :, None, :].expand(-1, gh, gw, -1), cols[:, None, :, :].expand(-1, gh, gw, -1)], dim=-1
            )
            return pe.reshape(1, gh * gw, -1)
        if cfg.posemb == "sincos2d":
            key = (grid[0], grid[1])
            pe = self._sincos_cache.get(key)
            if pe is None:
                pe = sincos_2d(grid[0], grid[1], cfg.embed_dim)[None]
                self._sincos_cache[key] = pe
            return pe.to(device=x.device, dtype=x.dtype)
        return None

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 1: patch embedding, class token, position embedding -> ``(B, T, D)``."""
        return self.embed_tokens(self.patch_embed(x), self.patch_embed.grid(*x.shape[-2:]))

    def embed_tokens(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """The rest of Eq. 1 for already projected patches ``(B, N, D)``: add position
        embeddings, prepend the class token. Objectives that corrupt patch
        embeddings (masked patch prediction, Sec. 4.6) enter here."""
        pe = self._posemb_for(grid, tokens)
        if pe is not None:
            tokens = tokens + pe
        if self.cls_token is not None:
            cls = self.cls_token.expand(tokens.shape[0], -1, -1)
            if self.config.posemb == "learn":
                cls = cls + self.pos_embed[:, :1]
            tokens = torch.cat([cls, tokens], dim=1)
        return self.pos_drop(tokens)

    def forward_features(
        self, x: torch.Tensor, *, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Eq. 1-3 and the final LayerNorm: ``(B, C, H, W)`` -> ``(B, T, D)``.

        With ``return_attention=True`` also returns each layer's attention
        weights ``(B, heads, T, T)``, computed exactly (no fused kernel).
        """
        want = return_attention or self._captured is not None
        if not want and (n := self.inference_chunk_size(x)) < x.shape[0]:
            return torch.cat([self.forward_features(c) for c in x.split(n)])  # type: ignore[misc]
        grid = self.patch_embed.grid(*x.shape[-2:])
        x = self.embed(x)
        attns: list[torch.Tensor] = []
        for blk in self.blocks:
            x, a = self._run_block(blk, x, grid, want)
            if want:
                assert a is not None
                attns.append(a)
        x = self.norm(x)
        if self._captured is not None:
            self._captured.extend(attns)
        return (x, attns) if return_attention else x

    def encode(self, z: torch.Tensor, grid: tuple[int, int], *, cls_only: bool = False) -> torch.Tensor:
        """Eq. 2-3 and the final LayerNorm on an embedded sequence ``z_0``. With ``cls_only`` the
        last block computes the class token alone (:meth:`Block.forward_cls`, callers check
        :meth:`_cls_only_applies`) and the result is ``(B, 1, D)``."""
        for blk in self.blocks[:-1] if cls_only else self.blocks:
            z, _ = self._run_block(blk, z, grid, False)
        if cls_only:
            z = self.blocks[-1].forward_cls(z)
        return self.norm(z)

    def _run_block(
        self, blk: nn.Module, x: torch.Tensor, grid: tuple[int, int], want: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.config.attention == "axial":
            return blk(x, grid=grid, return_attn=want)
        return blk(x, return_attn=want)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """z_L^0 for ``cls``; the mean of the patch tokens for ``gap``."""
        if self.config.pool == "cls":
            return x[:, 0]
        return x[:, self.num_prefix_tokens :].mean(dim=1)

    def forward_head(self, x: torch.Tensor, *, pre_logits: bool = False) -> torch.Tensor:
        """Pool the encoded tokens and classify; ``pre_logits=True`` stops before the classifier."""
        x = self.fc_norm(self.pool(x))
        x = self.pre_logits(self.head_drop(x))
        return x if pre_logits else self.head(x)

    def forward(
        self, x: torch.Tensor, *, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits ``(B, num_classes)``; with ``return_attention`` also the per-layer attention weights."""
        if return_attention:
            feats, attns = self.forward_features(x, return_attention=True)  # type: ignore[misc]
            return self.forward_head(feats), attns
        if self._captured is None and (n := self.inference_chunk_size(x)) < x.shape[0]:
            return torch.cat([self._logits(c) for c in x.split(n)])
        return self._logits(x)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        if not self._cls_only_applies():
            return self.forward_head(self.forward_features(x))  # type: ignore[arg-type]
        grid = self.patch_embed.grid(*x.shape[-2:])
        return self.forward_head(self.encode(self.embed(x), grid, cls_only=True))

    def _cls_only_applies(self) -> bool:
        """Whether ``forward`` may run the last block for the class token alone (see
        :attr:`cls_only_last_block`)."""
        last = self.blocks[-1] if len(self.blocks) else None
        return (
            self.cls_only_last_block
            and self._captured is None
            and self.config.pool == "cls"
            and self.cls_token is not None
            and type(last) is Block
            and type(last.attn) is Attention
        )

    def inference_chunk_size(self, x: torch.Tensor) -> int:
        """Images per chunk for a forward of the batch ``x`` without autograd.

        Why: eager PyTorch allocates a fresh tensor for every op's output, and on Linux glibc
        serves requests above 32 MiB with fresh ``mmap`` pages that the kernel zero-fills on
        first touch and takes back on free. ViT-S/16's MLP activations at batch 32 are 39 MB,
        so each of the 12 blocks page-faulted ~20k pages per forward (220k-300k per forward in
        all, 11-24% of its time on a 2-core CPU). Chunks whose widest activation
        (tokens x max(MLP width, 3 x width) x element size) stays under
        :attr:`inference_chunk_bytes` recycle heap memory instead, and are as exact: every
        image is computed on its own (the class-token-only last block's GEMMs over a few rows
        may round differently with the number of rows, ~1e-6). Training (autograd on), attention capture, tracing,
        export and ``torch.compile`` run the whole batch.
        """
        b = x.shape[0]
        limit = self.inference_chunk_bytes
        if limit is None or b <= 1 or not onednn.eager_cpu_inference(x):
            return b
        cfg = self.config
        gh, gw = self.patch_embed.grid(*x.shape[-2:])
        tokens = self.num_prefix_tokens + gh * gw
        per_image = tokens * max(cfg.mlp_dim, 3 * cfg.embed_dim) * x.element_size()
        chunks = -(-b // max(1, limit // per_image))  # as few as fit under the limit, then balanced
        return -(-b // chunks)

    def forward_intermediates(self, x: torch.Tensor) -> dict[str, Any]:
        """Everything an analysis may want, in the spirit of big_vision's ``out`` dict:
        ``stem`` (patch tokens), ``embedded`` (z_0), ``blocks`` (z_1 .. z_L),
        ``attention`` (per layer), ``encoded`` (after the final norm),
        ``pre_logits`` and ``logits``."""
        out: dict[str, Any] = {"stem": self.patch_embed(x)}
        grid = self.patch_embed.grid(*x.shape[-2:])
        z = self.embed(x)
        out["embedded"] = z
        blocks, attns = [], []
        for blk in self.blocks:
            z, a = self._run_block(blk, z, grid, True)
            blocks.append(z)
            attns.append(a)
        out["blocks"], out["attention"] = blocks, attns
        enc = self.norm(z)
        out["encoded"] = enc
        out["pre_logits"] = self.forward_head(enc, pre_logits=True)
        out["logits"] = self.head(out["pre_logits"])
        return out

    @contextlib.contextmanager
    def capture_attention(self) -> Iterator[list[torch.Tensor]]:
        """Context manager: every forward inside it appends each layer's exact
        attention weights to the yielded list (the fused kernel is bypassed)::

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

    # -- checkpoints at another resolution ---------------------------------------
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

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """``load_state_dict`` accepts checkpoints of another resolution: see :meth:`adapt_state_dict`."""
        self.adapt_state_dict(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # -- accounting ---------------------------------------------------------------
    def num_params(self, *, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def macs(self, img_size: tuple[int, int] | int | None = None, *, executed: bool = False) -> int:
        """Multiply-accumulates of one forward pass (matmuls only, as fvcore/timm count). With
        ``executed``, those ``forward`` actually runs: fewer when the last block computes the
        class token alone (:attr:`cls_only_last_block`)."""
        return count_macs(self.config, img_size, cls_only_last_block=executed and self._cls_only_applies())


def count_macs(
    cfg: ViTConfig, img_size: tuple[int, int] | int | None = None, *, cls_only_last_block: bool = False
) -> int:
    """Analytic multiply-accumulate count of a ViT forward pass at ``img_size``; with
    ``cls_only_last_block`` the last block computes keys and values for every token but the query,
    attention, projection and MLP for the class token alone (``Block.forward_cls``)."""
    if img_size is None:
        h, w = cfg.img_size
    elif isinstance(img_size, int):
        h = w = img_size
    else:
        h, w = img_size
    p, d = cfg.patch_size, cfg.embed_dim
    macs, chans = 0, cfg.in_chans
    if cfg.hybrid_layers is not None:
        macs, chans, (h, w) = backbone_macs(cfg.hybrid_layers, in_chans=cfg.in_chans, height=h, width=w)
    n = (-(-h // p)) * (-(-w // p))
    t = n + cfg.num_prefix_tokens
    macs += n * p * p * chans * d  # patch projection
    per_block = t * d * 3 * d + 2 * t * t * d + t * d * d + 2 * t * d * cfg.mlp_dim
    if cfg.attention == "axial":  # two half-blocks; each token attends to its row (column) and the class token
        gh, gw = (-(-h // p)), (-(-w // p))
        pre = cfg.num_prefix_tokens
        per_block = (
            2 * (t * d * 3 * d + t * d * d + 2 * t * d * cfg.mlp_dim) + 2 * n * (pre + gw) * d + 2 * n * (pre + gh) * d
        )
    macs += cfg.depth * per_block
    if cls_only_last_block and cfg.depth and cfg.attention != "axial":
        macs -= per_block - (t * d * 2 * d + d * d + 2 * t * d + d * d + 2 * d * cfg.mlp_dim)
    if cfg.head == "mlp":
        macs += d * cfg.pre_logits_dim
    macs += cfg.pre_logits_dim * cfg.num_classes
    return macs

"""timm's model API on the Vision Transformer: the names and meanings of
``timm.models.VisionTransformer`` (``num_features``, ``reset_classifier``, ``get_intermediate_layers``,
``set_grad_checkpointing``, ``group_matcher`` ...), so code written for timm runs on vitlab's model.
Nothing here adds to the paper's model: it names what :class:`~vitlab.models.VisionTransformer` has."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .config import ViTConfig

__all__ = ["EVAL_CROP_MODE", "EVAL_INTERPOLATION", "TIMM_POOL", "TimmModelApi", "pool_name", "pretrained_cfg"]

EVAL_INTERPOLATION = "bicubic"
"""How vitlab's evaluation resizes (:func:`vitlab.data.eval_transform` and the decode cache: PIL's bicubic, timm's
default for its ViTs), so that timm's transform of ``pretrained_cfg`` gives vitlab's pixels."""
EVAL_CROP_MODE = "center"
"""timm's name for how vitlab's evaluation crops a square input: the shorter side resized to
``floor(img_size / crop_pct)``, then the centre square (a non-square input: ``squash``, both sides resized)."""
_CARRIED = ("hf_hub_id", "license", "tag")
"""``pretrained_cfg`` keys taken from the config's ``extra`` (what is known of a public checkpoint)."""

TIMM_POOL = {"cls": "token", "gap": "avg", "map": "map"}
"""Our pooling names -> timm's ``global_pool`` values. (CCT's sequence pooling, ``seq``, has no timm name.)"""
_POOL_NAMES = (*TIMM_POOL, "seq")


def pool_name(global_pool: str) -> str:
    """Our pooling name for timm's ``global_pool`` (``token`` -> ``cls``, ``avg`` -> ``gap``) or ours."""
    ours = {v: k for k, v in TIMM_POOL.items()}.get(global_pool, global_pool)
    if ours not in _POOL_NAMES:
        names = sorted({*_POOL_NAMES, *TIMM_POOL.values()})
        raise ConfigError(f"global_pool: {global_pool!r} is not one of {', '.join(names)}")
    return ours


def _per_channel(values: tuple[float, ...], in_chans: int) -> tuple[float, ...]:
    """A 3-value mean or std for ``in_chans`` channels, as the evaluation transform normalises: the first
    ``in_chans`` values, the last one repeated for more channels."""
    out = list(values)[:in_chans]
    return tuple(out + [out[-1]] * (in_chans - len(out)))


def pretrained_cfg(cfg: ViTConfig) -> dict[str, Any]:
    """timm's ``pretrained_cfg`` for a model of config ``cfg``: the preprocessing vitlab evaluates it with
    (its ``img_size``, ``mean``, ``std``, ``crop_pct``; bicubic resizing of the shorter side then a centre
    crop, timm's ``center`` mode; both sides for a non-square input, ``squash``), the classifier's name and,
    for a public checkpoint, its Hub repo and licence.
    ``timm.data.resolve_data_config({}, model=model)`` then ``timm.data.create_transform(**config)`` give
    the pixels of vitlab's evaluation."""
    c = cfg.in_chans
    if cfg.stem == "conv":
        first_conv = "patch_embed.convs.0"
    elif cfg.hybrid_layers is None:
        first_conv = "patch_embed.proj"
    else:  # the ResNet's first convolution (only the stem when no stage is kept)
        first_conv = "patch_embed.backbone.stem.conv" if cfg.hybrid_layers else "patch_embed.backbone.conv"
    out: dict[str, Any] = {
        "architecture": cfg.name,
        "input_size": (c, *cfg.img_size),
        "fixed_input_size": False,  # learned position embeddings are resampled to other sizes on the fly
        "interpolation": EVAL_INTERPOLATION,
        "crop_pct": cfg.crop_pct,
        "crop_mode": EVAL_CROP_MODE if cfg.img_size[0] == cfg.img_size[1] else "squash",
        "mean": _per_channel(cfg.mean, c),
        "std": _per_channel(cfg.std, c),
        "num_classes": cfg.num_classes,
        "pool_size": None,
        "first_conv": first_conv,
        "classifier": ("head", "head_dist") if cfg.dist_token else "head",
    }
    if cfg.class_names is not None:
        out["label_names"] = tuple(cfg.class_names)
    out.update({k: cfg.extra[k] for k in _CARRIED if isinstance(cfg.extra.get(k), str)})
    return out


class TimmModelApi:
    """The timm-named methods of :class:`~vitlab.models.VisionTransformer` (a mixin: it reads the model's
    ``config``, ``blocks``, heads and ``encode``)."""

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's ``pretrained_cfg`` (:func:`pretrained_cfg`), built from the model's config each time it is
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

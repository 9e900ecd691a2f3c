"""The Vision Transformer with its speed paths, and the one function that hands them out.

:class:`FastVisionTransformer` is a :class:`~vitlab.models.VisionTransformer` with the same
submodules, parameter names and results (to float32 rounding). Besides its blocks' paths
(:class:`.blocks.FastBlock`) it

- runs the last block for the class token alone under class-token pooling
  (:meth:`.blocks.FastBlock.forward_cls`): the logits need nothing else of it;
- splits gradient-free CPU forwards into chunks of the batch (:meth:`inference_chunk_size`).

Both take the token count from the embedded sequence, so training with token dropping
(``patch_drop_rate``: fewer patch tokens, the class token first) runs them unchanged; the batch is
then not chunked (:meth:`FastVisionTransformer.drops_tokens`).

Both run only where nobody could tell: no hooks anywhere in the model, no token merging, the last block exactly as
built, no attention capture, an eager (not traced or compiled) forward, and images in a batch rather than packed.

Packed images (:class:`~vitlab.models.packed.PackedPatches`, NaViT) run their blocks by length
(:meth:`FastVisionTransformer.encode_packed`): the images of one length as one batch through every block, so that
each block takes its speed paths, as exact as the packed sequences' attention within each image.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..models.flops import block_macs
from ..models.layers import Block, DropPath, PatchDropout
from ..models.packed import PackedAttention, PackedPatches
from ..models.packed import check as check_packed
from ..models.vit import VisionTransformer
from .blocks import FastBlock, paper_block
from .buffers import share_scratch
from .c_kernels import available as c_kernels_available
from .onednn import applies as onednn_applies
from .onednn import eager_cpu_inference
from .switch import enabled, hooks_anywhere, running_eagerly

__all__ = ["INFERENCE_CHUNK_BYTES", "FastVisionTransformer", "accelerate", "inference_path", "training_path"]

INFERENCE_CHUNK_BYTES = 24 * 2**20
"""Default bound on the widest activation of one inference chunk (see
:meth:`FastVisionTransformer.inference_chunk_size`): below glibc malloc's 32 MiB ceiling for
serving a request from its heap instead of fresh ``mmap``-ed (page-faulted) memory."""


class FastVisionTransformer(VisionTransformer):
    """:class:`~vitlab.models.VisionTransformer` with the speed paths of :mod:`vitlab.accel`.

    Built like the plain class (``FastVisionTransformer(cfg, num_classes=10)``), or converted in
    place from one by :func:`accelerate`."""

    def __init__(self, config: Any = None, /, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        _convert_blocks(self)
        self._init_accel()

    def _init_accel(self) -> None:
        self.inference_chunk_bytes: int | None = INFERENCE_CHUNK_BYTES
        """Split gradient-free CPU forwards into chunks of the batch whose widest activation
        stays under this many bytes; ``None`` turns it off."""
        self.cls_only_last_block = True
        """With class-token pooling, ``forward`` runs the last block for the class token only."""

    def accelerable(self, x: torch.Tensor | PackedPatches) -> bool:
        """Whether the model-level paths may run on ``x``: the switch is on, the forward is eager,
        nothing captures attention, no token merging (:mod:`vitlab.models.tome`) changes the sequence,
        ``x`` is a batch of images (not packed ones), and no hook is registered anywhere in the model."""
        return (
            enabled()
            and self._captured is None
            and not self.tome_r
            and not isinstance(x, PackedPatches)
            and running_eagerly()
            and not hooks_anywhere(self)
        )

    def packed_accelerable(self) -> bool:
        """Whether :meth:`encode_packed` may run the blocks on each length of image in turn (the images of one
        length as a batch) instead of on the packed sequences: what :meth:`accelerable` asks of a batch, every block
        a :class:`.blocks.FastBlock`, no activation checkpointing, and in training no dropout or stochastic depth in
        the blocks (their draws would fall otherwise than on the packed sequences: stochastic depth drops a whole
        sequence there)."""
        return (
            enabled()
            and self._captured is None
            and not self.tome_r
            and running_eagerly()
            and not hooks_anywhere(self)
            and not (self.grad_checkpointing and self.training and torch.is_grad_enabled())
            and all(type(b) is FastBlock for b in self.blocks)
            and not (self.training and _draws(self.blocks))
        )

    def encode_packed(self, packed: PackedPatches, *, attention: bool = False) -> dict[str, Any]:
        """As :meth:`VisionTransformer.encode_packed` (Eq. 1-3 and the final LayerNorm on packed images), with the
        blocks run on the images of each length as one batch ``(images, length, D)`` (:meth:`_by_length`): a token
        attends to its own image's alone either way, and the rest of a block is per token, so the results are the
        same, while each block takes its speed paths (:class:`.blocks.FastBlock`) instead of the packed sequences'
        plain forward (NaViT's packing is for a TPU's fixed shapes; on a CPU, batches of one length are as exact and
        need no gathered attention). Padding comes back as zeros before the final LayerNorm (no image reads it)."""
        if attention or not self.packed_accelerable():
            return super().encode_packed(packed, attention=attention)
        start, length = check_packed(self, packed)
        z = self._embed_packed(packed, start)
        b, s, d = z.shape
        packing = PackedAttention(packed.image_ids, self.packed_attention)
        groups = self._by_length(z, packing)
        for blk in self.blocks:
            groups = [blk(g) for g in groups]
        rows = torch.cat([g.reshape(-1, d) for g in groups] + [z.new_zeros(1, d)])
        encoded = self.norm(F.embedding(packing.gather[3], rows).view(b, s, d))  # (a lookup: the faster backward)
        return {"blocks": [], "attention": [], "encoded": encoded, "start": start, "length": length}

    def forward_packed(self, packed: PackedPatches, *, pre_logits: bool = False, return_attention: bool = False) -> Any:
        """As :meth:`VisionTransformer.forward_packed`; under class-token pooling (:meth:`cls_only_applies`) with the
        blocks by length (:meth:`encode_packed`), the last block runs for each image's class token alone, as
        :meth:`forward` does for a batch of images."""
        if return_attention or not (self.packed_accelerable() and self.cls_only_applies()):
            return super().forward_packed(packed, pre_logits=pre_logits, return_attention=return_attention)
        z = self._embed_packed(packed, check_packed(self, packed)[0])
        packing = PackedAttention(packed.image_ids, self.packed_attention)
        groups = self._by_length(z, packing)
        for blk in self.blocks[:-1]:
            groups = [blk(g) for g in groups]
        cls = torch.cat([self.blocks[-1].forward_cls(g) for g in groups])  # (images, 1, D), by length
        images = [i for seq in packing.runs for i, _ in seq]  # each run's image id (-1: padding)
        at = torch.tensor([images[r] for group in packing.same_length for r in group], device=cls.device)
        return self.forward_head(self.norm(cls[torch.argsort(at)]), pre_logits=pre_logits)  # in the images' order

    @staticmethod
    def _by_length(z: torch.Tensor, packing: PackedAttention) -> list[torch.Tensor]:
        """The embedded packed tokens ``z`` ``(B, S, D)`` of the images of each length as one batch ``(images,
        length, D)`` (:attr:`~vitlab.models.packed.PackedAttention.gather`'s index and groups)."""
        order, sizes, shapes, _ = packing.gather
        d = z.shape[-1]
        return [g.view(n, t, d) for g, (n, t) in zip(z.reshape(-1, d)[order].split(sizes), shapes, strict=True)]

    def cls_only_applies(self) -> bool:
        """Whether ``forward`` may run the last block for the class token alone."""
        last = self.blocks[-1] if len(self.blocks) else None
        return (
            self.cls_only_last_block
            and not self.tome_r
            and self.config.pool == "cls"
            and not self.config.dist_token
            and self.cls_token is not None
            and type(last) is FastBlock
            and paper_block(last)
            and type(self.norm) is nn.LayerNorm
            and not (self.grad_checkpointing and self.training and torch.is_grad_enabled())
        )

    def drops_tokens(self) -> bool:
        """Whether forwards drop patch tokens now (training with a ``patch_drop`` rate above 0, which a
        training schedule may set to 0): the batch is then run whole, so that one draw of the RNG picks the kept
        tokens as the plain class does."""
        return self.training and isinstance(self.patch_drop, PatchDropout) and self.patch_drop.p > 0

    def inference_chunk_size(self, x: torch.Tensor) -> int:
        """Images per chunk for a forward of the batch ``x`` without autograd.

        Eager PyTorch allocates a fresh tensor for every op's output, and on Linux glibc serves
        requests above 32 MiB with fresh ``mmap`` pages that the kernel zero-fills on first touch
        and takes back on free, so a large batch page-faults its MLP activations in every block.
        Chunks whose widest activation (tokens x max(MLP width, 3 x width) x element size) stays
        under :attr:`inference_chunk_bytes` recycle heap memory instead, and are as exact: every
        image is computed on its own. Training (autograd on), tracing, export and
        ``torch.compile`` run the whole batch.
        """
        b = x.shape[0]
        limit = self.inference_chunk_bytes
        if limit is None or b <= 1 or not eager_cpu_inference(x) or self.drops_tokens():
            return b
        cfg = self.config
        gh, gw = self.grid(x)
        per_image = (self.num_prefix_tokens + gh * gw) * max(cfg.mlp_dim, 3 * cfg.embed_dim) * x.element_size()
        chunks = -(-b // max(1, limit // per_image))  # as few as fit under the limit, then balanced
        return -(-b // chunks)

    def forward_features(
        self, x: torch.Tensor, *, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        if not return_attention and self.accelerable(x) and (n := self.inference_chunk_size(x)) < x.shape[0]:
            plain = super().forward_features
            return torch.cat([plain(c) for c in x.split(n)])  # type: ignore[misc]
        return super().forward_features(x, return_attention=return_attention)

    def forward(
        self, x: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        if not self.accelerable(x) or return_attention is True:  # (a symbolic trace is not accelerable)
            return super().forward(x, return_attention=return_attention)
        if (n := self.inference_chunk_size(x)) < x.shape[0]:
            return torch.cat([self._logits(c) for c in x.split(n)])
        return self._logits(x)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        if not self.cls_only_applies():
            return self.forward_head(super().forward_features(x))  # type: ignore[arg-type]
        z = self.embed(x)
        for blk in self.blocks[:-1]:
            z = blk(z)
        return self.forward_head(self.norm(self.blocks[-1].forward_cls(z)))

    def macs(self, img_size: tuple[int, int] | int | None = None, *, executed: bool = False) -> int:
        """As :meth:`VisionTransformer.macs`; with ``executed``, less the work the class-token-only
        last block skips when it runs."""
        full = super().macs(img_size, executed=executed)
        if not (executed and self.cls_only_applies() and self.config.attention != "axial"):
            return full
        cfg = self.config
        h, w = (img_size, img_size) if isinstance(img_size, int) else (img_size or cfg.img_size)
        gh, gw = self.patch_embed.grid(h, w)
        t, d = gh * gw + self.num_prefix_tokens, cfg.embed_dim
        kept = t * d * 2 * d + d * d + 2 * t * d + d * d + 2 * d * cfg.mlp_dim  # k, v for all; the rest for one
        return full - block_macs(cfg, t) + kept


def _draws(blocks: nn.Module) -> bool:
    """Whether a training forward of ``blocks`` draws random numbers (dropout, attention dropout, stochastic depth)."""
    return any(
        (isinstance(m, (nn.Dropout, DropPath)) and m.p > 0)
        or (isinstance(a := getattr(m, "attn_drop", 0.0), (int, float)) and a > 0)
        for m in blocks.modules()
    )


def _convert_blocks(model: nn.Module) -> None:
    for m in model.modules():
        if type(m) is Block:
            m.__class__ = FastBlock
            m._init_accel()  # type: ignore[attr-defined]
    share_scratch(m for m in model.modules() if isinstance(m, FastBlock))


def accelerate(model: nn.Module) -> nn.Module:
    """``model`` with the speed paths, converted in place and returned: every plain
    :class:`~vitlab.models.VisionTransformer` inside it becomes a :class:`FastVisionTransformer`
    and every plain :class:`~vitlab.models.Block` a :class:`.blocks.FastBlock` (the class only:
    parameters, names and results stay). Subclasses of the plain classes are left as they are.
    With the speed paths switched off (:func:`vitlab.accel.set_enabled`) it returns ``model``
    unchanged."""
    if not enabled():
        return model
    for m in model.modules():
        if type(m) is VisionTransformer:
            m.__class__ = FastVisionTransformer
            m._init_accel()  # type: ignore[attr-defined]
    _convert_blocks(model)
    return model


def inference_path(model: nn.Module, x: torch.Tensor) -> str:
    """Which CPU inference path an eval-mode forward of ``model`` on ``x`` takes, in words:
    ``oneDNN fused linears`` or ``aten``, and the batch chunks if any."""
    model.eval()
    with torch.inference_mode():
        blocks = [b for b in model.modules() if isinstance(b, FastBlock)]
        fused = bool(blocks) and all(b.accelerable() for b in blocks) and onednn_applies(blocks[0], x)
        whole = isinstance(model, FastVisionTransformer) and model.accelerable(x)
        size = model.inference_chunk_size(x) if whole else x.shape[0]  # type: ignore[union-attr]
    parts = ["oneDNN fused linears" if fused else "aten"]
    if size < x.shape[0]:
        parts.append(f"{-(-x.shape[0] // size)} chunks of <= {size}")
    return ", ".join(parts)


def training_path(model: nn.Module) -> str:
    """Which CPU training path a float32 eager training forward of ``model`` takes, in words:
    ``fused blocks, C kernels``, ``fused blocks, ATen kernels`` or ``autograd``."""
    from . import fused_block

    blocks = [b for b in model.modules() if isinstance(b, Block)]
    with torch.enable_grad():
        fused = bool(blocks) and all(
            isinstance(b, FastBlock)
            and b.training
            and (
                (b.accelerable() and fused_block.applies(b, torch.empty(1, 1, b.norm1.normalized_shape[0])))
                or b.trains_fused_with_adapters(torch.empty(1, 1, b.norm1.normalized_shape[0]))
            )
            for b in blocks
        )
    if not fused:
        return "autograd"
    kernels = c_kernels_available() and all(fused_block.uses_c_kernels(b) for b in blocks)  # type: ignore[arg-type]
    return "fused blocks, " + ("C kernels" if kernels else "ATen kernels")

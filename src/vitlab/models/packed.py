"""Packed input: several images of any shapes in one sequence (NaViT: Dehghani et al. 2023, "Patch n' Pack:
NaViT, a Vision Transformer for any Aspect Ratio and Resolution", Sec. 2).

Each image keeps its own patch grid (its aspect ratio and resolution); the patch tokens of several images are
laid end to end in sequences of a fixed length, and the ViT of Eq. 1-4 runs on them unchanged except that

- **Eq. 1 per image**: each image's segment of the sequence is its own ``[x_class; x_p^1 E; ...] + E_pos``: the
  prefix slots (class, distillation, register tokens) come first, then its patches, projected by E (the
  convolution's weights as one linear map of the flattened ``(C, P, P)`` patch). E_pos is looked up per token
  from its (row, column): the 2-D tables (``learn2d``, NaViT's factorised embedding; ``sincos2d``) directly, the
  paper's 1-D learned table resampled in 2-D to the image's grid (Sec. 3.2), once per distinct grid;
- **attention is block-diagonal** (Eq. 2): a token attends only to the tokens of its own image
  (:class:`PackedAttention`: one attention call per image, or one with a block mask);
- **pooling per image** (Eq. 4): each image's class token, or the mean (or attention pooling) of its own patch
  tokens; padding is never pooled.

So each image's logits are those of the unpacked model on that image alone (to float rounding). What is not
packed-aware is refused: axial attention, 2-D RoPE, a hybrid stem, replaced blocks, token merging, and token
dropping inside the model (drop tokens before packing instead: :func:`drop_tokens`).

The packing, its checks and the block-diagonal attention live here; the model's entry points (``model(packed)``,
:meth:`~.vit.VisionTransformer.embed_packed`, ``encode_packed``, ``forward_packed``) are methods of the class in
:mod:`.vit`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ..errors import ConfigError, InputError
from .layers import Attention, Block, PatchEmbed

__all__ = [
    "ATTENTION_METHODS",
    "PackedAttention",
    "PackedPatches",
    "PatchTokens",
    "drop_tokens",
    "pack",
    "patchify",
    "refusal",
    "unpack",
]


class PatchTokens(NamedTuple):
    """One image cut into patches: ``patches`` ``(N, C*P*P)`` (each patch's pixels flattened in ``(C, P, P)``
    order, the layout of the patch projection's weights), the ``rows`` and ``cols`` ``(N,)`` of the patches in
    the image's patch ``grid`` ``(rows, cols)``. Any subset of the grid's patches (token dropping) is allowed."""

    patches: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    grid: tuple[int, int]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackedPatches:
    """A batch of ``B`` sequences of ``S`` tokens holding ``n`` images.

    ``patches`` ``(B, S, C*P*P)``: the pixels of each patch token (:class:`PatchTokens` layout), zero elsewhere.
    ``image_ids`` ``(B, S)`` int64: the image a token belongs to (0 .. n-1, numbered in order of appearance),
    -1 for padding. ``rows``, ``cols`` ``(B, S)`` int64: a patch token's place in its image's grid, -1 for the
    prefix slots and padding. ``grids`` ``(n, 2)`` int64: each image's patch grid (rows, columns).
    ``prefix_tokens``: slots reserved at the start of each image's tokens for the model's class, distillation and
    register tokens (its ``num_prefix_tokens``).

    Layout: an image's tokens are contiguous, inside one sequence: its prefix slots, then its patches.
    :func:`pack` builds it."""

    patches: torch.Tensor
    image_ids: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    grids: torch.Tensor
    prefix_tokens: int

    @property
    def num_images(self) -> int:
        return int(self.grids.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        """``(sequences, tokens per sequence)``."""
        return int(self.image_ids.shape[0]), int(self.image_ids.shape[1])

    def padding_fraction(self) -> float:
        """The fraction of the batch's token slots that hold no image."""
        return float((self.image_ids < 0).sum()) / max(1, self.image_ids.numel())

    def to(self, device: Any = None, dtype: torch.dtype | None = None, *, non_blocking: bool = False) -> PackedPatches:
        """On ``device``, the pixels in ``dtype`` (the integer tensors stay int64)."""
        move = {
            f: getattr(self, f).to(device, non_blocking=non_blocking) for f in ("image_ids", "rows", "cols", "grids")
        }
        patches = self.patches.to(device, dtype, non_blocking=non_blocking)
        return dataclasses.replace(self, patches=patches, **move)


def patchify(image: torch.Tensor, patch_size: int) -> PatchTokens:
    """``(C, H, W)`` pixels (sides divisible by ``patch_size``) as :class:`PatchTokens`, patches in row-major
    order: what the patch embedding's convolution sees, one row per patch."""
    c, h, w = image.shape
    p = patch_size
    if h % p or w % p:
        raise InputError(f"image size {h}x{w} is not divisible by the patch size {p}")
    gh, gw = h // p, w // p
    patches = image.reshape(c, gh, p, gw, p).permute(1, 3, 0, 2, 4).reshape(gh * gw, c * p * p)
    rows, cols = grid_places(gh, gw, image.device)
    return PatchTokens(patches, rows, cols, (gh, gw))


@functools.lru_cache(maxsize=1024)
def grid_places(rows: int, cols: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The row and column ``(rows * cols,)`` of each patch of a ``rows`` x ``cols`` grid in row-major order. Made
    once a grid and shared by its images' :class:`PatchTokens` (read, never written: indexing and packing copy
    them); the four small tensor calls an image were an eighth of a packed batch's loading on a CPU (docs/training.md,
    "Packing")."""
    return torch.arange(rows, device=device).repeat_interleave(cols), torch.arange(cols, device=device).repeat(rows)


def drop_tokens(tokens: PatchTokens, rate: float, *, generator: torch.Generator | None = None) -> PatchTokens:
    """Token dropping before packing (NaViT Sec. 3.4, after PatchDropout, Liu et al. 2022): a random
    ``max(1, int(N * (1 - rate)))`` of the image's ``N`` patches, kept in their order. ``rate`` 0: unchanged."""
    if not 0.0 <= rate < 1.0:
        raise ConfigError(f"token drop rate: must be in [0, 1), got {rate}")
    n = tokens.patches.shape[0]
    keep = max(1, int(n * (1.0 - rate)))
    if keep >= n:
        return tokens
    idx = torch.randperm(n, generator=generator)[:keep].sort().values.to(tokens.rows.device)
    return PatchTokens(tokens.patches[idx], tokens.rows[idx], tokens.cols[idx], tokens.grid)


def pack(sequences: Sequence[Sequence[PatchTokens]], *, seq_len: int, prefix_tokens: int) -> PackedPatches:
    """Images laid out as :class:`PackedPatches`: ``sequences[b]`` are the images of sequence ``b`` (each taking
    ``prefix_tokens`` + its patches of the ``seq_len`` slots), padded at the end; images are numbered in order."""
    images = [t for seq in sequences for t in seq]
    if not images:
        raise InputError("pack: no images")
    k = images[0].patches.shape[1]
    dtype, device = images[0].patches.dtype, images[0].patches.device
    b = len(sequences)
    patches = torch.zeros(b, seq_len, k, dtype=dtype, device=device)
    ids = torch.full((b, seq_len), -1, dtype=torch.int64, device=device)
    rows, cols = ids.clone(), ids.clone()
    i = 0
    for s, seq in enumerate(sequences):
        o = 0
        for t in seq:
            n = t.patches.shape[0]
            if o + prefix_tokens + n > seq_len:
                raise InputError(f"pack: the images of sequence {s} take more than its {seq_len} tokens")
            ids[s, o : o + prefix_tokens + n] = i
            o += prefix_tokens
            patches[s, o : o + n] = t.patches
            rows[s, o : o + n], cols[s, o : o + n] = t.rows, t.cols
            o, i = o + n, i + 1
    grids = torch.tensor([t.grid for t in images], dtype=torch.int64, device=device)
    return PackedPatches(patches=patches, image_ids=ids, rows=rows, cols=cols, grids=grids, prefix_tokens=prefix_tokens)


def segments(packed: PackedPatches) -> tuple[torch.Tensor, torch.Tensor]:
    """``(start, length)`` ``(n,)`` of each image's tokens in the flattened ``(B * S)`` batch."""
    ids = packed.image_ids.reshape(-1)
    valid = ids >= 0
    img = ids[valid]
    pos = torch.arange(ids.numel(), device=ids.device)[valid]
    n = packed.num_images
    length = torch.bincount(img, minlength=n)
    start = torch.full((n,), ids.numel(), dtype=torch.int64, device=ids.device).scatter_reduce(0, img, pos, "amin")
    return start, length


def refusal(model: Any) -> str | None:
    """Why ``model`` cannot take packed images (a model option that needs whole square grids), or None."""
    cfg = model.config
    refused = [
        (cfg.attention != "global", "axial attention needs a whole grid"),
        (cfg.rope, "2-D RoPE is not packed-aware yet"),
        (bool(model.tome_r), "token merging is on (set_tome(0) first)"),
        (model.packed_attention not in ATTENTION_METHODS, f"packed_attention {model.packed_attention!r} is unknown"),
        (type(model.patch_embed) is not PatchEmbed, "a hybrid or convolutional stem needs whole images"),
        (
            model.training and getattr(model.patch_drop, "p", 0.0) > 0,
            "token dropping happens before packing (drop_tokens): set the model's patch_drop rate to 0",
        ),
    ]
    refused += [
        (not isinstance(blk, Block) or type(blk.attn) is not Attention, f"block {i} is a {type(blk).__name__}")
        for i, blk in enumerate(model.blocks)
    ]
    return next((msg for bad, msg in refused if bad), None)


def check(model: Any, packed: PackedPatches) -> tuple[torch.Tensor, torch.Tensor]:
    """``(start, length)`` of each image (:func:`segments`) once ``packed`` is known to fit ``model`` and to be
    laid out as :class:`PackedPatches` says; else an :class:`InputError` (the input) or :class:`ConfigError`
    (a model option that does not apply to packed images: :func:`refusal`)."""
    if why := refusal(model):
        raise ConfigError(f"packed input: {why}")
    cfg = model.config
    x, ids = packed.patches, packed.image_ids
    if x.ndim != 3 or ids.shape != x.shape[:2] or packed.rows.shape != ids.shape or packed.cols.shape != ids.shape:
        raise InputError(f"packed input: patches (B, S, K) and ids/rows/cols (B, S) expected, got {tuple(x.shape)}")
    k = cfg.in_chans * cfg.patch_size**2
    if x.shape[2] != k:
        raise InputError(f"packed input: patches of {x.shape[2]} values; the model takes C x P x P = {k}")
    if packed.prefix_tokens != model.num_prefix_tokens:
        raise InputError(
            f"packed input: {packed.prefix_tokens} prefix slots per image; the model has {model.num_prefix_tokens}"
        )
    n, grids = packed.num_images, packed.grids
    if grids.ndim != 2 or grids.shape[1] != 2 or n == 0 or int(grids.min()) < 1:
        raise InputError(f"packed input: grids must be (images, 2) positive, got {tuple(grids.shape)}")
    if int(ids.max()) >= n or int(ids.min()) < -1:
        raise InputError(f"packed input: image ids must be in [-1, {n}), got [{int(ids.min())}, {int(ids.max())}]")
    start, length = segments(packed)
    s = ids.shape[1]
    if int((length <= packed.prefix_tokens).sum()):
        raise InputError("packed input: an image has no patch tokens")
    flat = ids.reshape(-1)
    valid = flat >= 0
    img = flat[valid]
    offset = torch.arange(flat.numel(), device=flat.device)[valid] - start[img]
    if int((offset >= length[img]).sum()) or int((start // s != (start + length - 1) // s).sum()):
        raise InputError("packed input: each image's tokens must be contiguous, inside one sequence")
    r, c = packed.rows.reshape(-1)[valid], packed.cols.reshape(-1)[valid]
    is_prefix = offset < packed.prefix_tokens
    bad_prefix = (is_prefix & ((r != -1) | (c != -1))) | (~is_prefix & ((r < 0) | (c < 0)))
    if int(bad_prefix.sum()) or int(((r >= grids[img, 0]) | (c >= grids[img, 1])).sum()):
        raise InputError("packed input: rows/cols must be -1 at prefix slots and inside the image's grid elsewhere")
    return start, length


ATTENTION_METHODS = ("split", "mask")


@dataclasses.dataclass(frozen=True)
class PackedAttention:
    """Attention within each image of packed sequences (Eq. 2 per image), handed to every block.

    ``split`` (the default) gathers the tokens of the images of each length into one batch (one index for all
    lengths), runs ``F.scaled_dot_product_attention`` once a length, and puts the outputs back in place by a second
    index (padding is not attended: its outputs are zeros); ``mask`` runs it once on the whole
    batch with a boolean ``(B, 1, S, S)`` block mask, computing the masked pairs too (padding attends to padding).
    Both compute each image's attention exactly; ``benchmarks/bench_packed_attention.py`` times them."""

    image_ids: torch.Tensor
    method: str = "split"

    @functools.cached_property
    def runs(self) -> list[list[tuple[int, int]]]:
        """Per sequence, ``(image id, length)`` of each run of consecutive tokens of one image (-1: padding)."""
        out = []
        for seq in self.image_ids:
            ids, counts = torch.unique_consecutive(seq, return_counts=True)
            out.append(list(zip(ids.tolist(), counts.tolist(), strict=True)))
        return out

    @functools.cached_property
    def same_length(self) -> list[list[int]]:
        """The images' runs (their indices among all runs, in order) grouped by length: each group attends in
        one batched call (a call per image pays a call's overhead per image in every block, forward and backward)."""
        groups: dict[int, list[int]] = {}
        for r, (i, n) in enumerate(run for seq in self.runs for run in seq):
            if i >= 0:
                groups.setdefault(n, []).append(r)
        return list(groups.values())

    @functools.cached_property
    def gather(self) -> tuple[torch.Tensor, list[int], list[tuple[int, int]], torch.Tensor]:
        """Where each image's tokens are among the flattened ``(B * S)`` tokens, computed once for every block:
        ``(order, sizes, shapes, back)``. ``order``: the tokens of the images of each length (:attr:`same_length`),
        image after image, group after group; ``sizes``: each group's tokens; ``shapes``: its ``(images, length)``;
        ``back``: each token's row among the groups' outputs in that order (a padding token's: one row past
        them, where ``attend`` puts zeros)."""
        s = self.image_ids.shape[1]
        starts = [b * s + o for b, seq in enumerate(self.runs)
                  for o in itertools.accumulate((n for _, n in seq[:-1]), initial=0)]  # fmt: skip
        lengths = [n for seq in self.runs for _, n in seq]
        order, sizes, shapes = [], [], []
        for at in self.same_length:
            n = lengths[at[0]]
            order.append((torch.tensor([starts[r] for r in at])[:, None] + torch.arange(n)).reshape(-1))
            sizes.append(len(at) * n)
            shapes.append((len(at), n))
        order_t = torch.cat(order)
        back = torch.full((self.image_ids.numel(),), order_t.numel(), dtype=torch.int64)
        back[order_t] = torch.arange(order_t.numel())
        device = self.image_ids.device
        return order_t.to(device), sizes, shapes, back.to(device)

    def mask(self) -> torch.Tensor:
        """``(B, 1, S, S)`` boolean: query ``i`` may attend to key ``j`` (the same image, or both padding)."""
        ids = self.image_ids
        return (ids[:, :, None] == ids[:, None, :])[:, None]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float = 0.0) -> torch.Tensor:
        """``softmax(q k^T / sqrt(d)) v`` within each image, for ``(B, heads, S, d)`` queries, keys and values."""
        if self.method == "mask":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask(), dropout_p=dropout_p)
        order, sizes, shapes, back = self.gather
        b, h, s, d = q.shape
        # (B * S, heads, d) rows, one a token (a view of the projection's output); one gather a tensor, not a cut and
        # a concatenation an image: those were a tenth of a packed training step on a CPU (docs/training.md)
        parts = [t.transpose(1, 2).flatten(0, 1).index_select(0, order).split(sizes) for t in (q, k, v)]
        out = []
        for (n, length), *rows in zip(shapes, *parts, strict=True):  # the images of one length: one batched call
            qkv = [t.view(n, length, h, d).transpose(1, 2) for t in rows]
            o = F.scaled_dot_product_attention(*qkv, dropout_p=dropout_p)
            out.append(o.transpose(1, 2).reshape(n * length, h, d))
        out.append(q.new_zeros(1, h, d))  # padding tokens attend to nothing: zeros
        return torch.cat(out).index_select(0, back).view(b, s, h, d).transpose(1, 2)


def unpack(tokens: torch.Tensor, start: torch.Tensor, length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed ``(B, S, D)`` tokens as one padded row per image, ``(n, L, D)`` with ``L`` the longest image,
    and ``(n, L, 1)`` weights, 1 for the image's tokens and 0 for the padding after them. (Rows gathered as an
    embedding lookup: on a CPU its backward is faster than an indexing gather's; docs/training.md, "Packing".)"""
    steps = torch.arange(int(length.max()), device=tokens.device)
    valid = steps[None] < length[:, None]
    idx = torch.where(valid, start[:, None] + steps[None], start[:, None])
    return F.embedding(idx, tokens.reshape(-1, tokens.shape[-1])), valid[..., None].to(tokens.dtype)

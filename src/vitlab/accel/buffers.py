"""Memory the fused training block (:mod:`.fused_block`) keeps from one step to the next.

Eager PyTorch allocates every activation afresh each step, and glibc hands large blocks back
to the kernel when they are freed, so each step page-faults its activations in again. A block
that writes its activations into buffers it keeps (:class:`Workspace`), and a model whose
blocks share one set of buffers for their backwards' temporaries (:class:`Scratch`), touch the
same memory every step instead. Copies and pickles of a model start with empty buffers.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["Alloc", "Scratch", "Workspace", "fresh", "share_scratch"]

Alloc = Callable[[str, tuple[int, ...], torch.Tensor], torch.Tensor]
"""``buf(name, shape, like)``: a tensor to write an activation into."""


def fresh(name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(shape)


class _Buffers:
    """Named tensors kept between calls, re-made when a shape changes (another batch size).
    Copies and pickles start empty."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def _buffer(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        t = self._buffers.get(name)
        if t is None or t.shape != shape or t.dtype != like.dtype or t.device != like.device:
            t = self._buffers[name] = like.new_empty(shape)
        return t

    def nbytes(self) -> int:
        """Bytes held."""
        return sum(t.numel() * t.element_size() for t in self._buffers.values())

    def clear(self) -> None:
        self._buffers.clear()

    def __deepcopy__(self, memo: dict[int, Any]) -> _Buffers:
        return type(self)()

    def __reduce__(self) -> tuple[type[_Buffers], tuple[()]]:
        return (type(self), ())


_storage_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)


def _uses(t: torch.Tensor) -> int:
    assert _storage_use_count is not None
    return _storage_use_count(t.untyped_storage()._cdata)


class Workspace(_Buffers):
    """Activation buffers a fused block reuses from one training step to the next.

    :meth:`lease` hands the buffers to one forward (its autograd node ``ctx``) until that
    node's backward has run (:meth:`release`) or the node is gone (its graph was dropped);
    meanwhile other forwards get fresh memory. :meth:`returned` keeps the tensors the block
    hands out (its output, its input gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self._holder: weakref.ref[Any] | None = None
        self._uses_when_made: dict[str, int] = {}

    def returned(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A tensor to hand to the caller: last step's, when nothing but this workspace refers
        to its memory any more (PyTorch's count of the tensors and views on its storage is
        what it was when made), else fresh memory. So a caller, a hook or a graph that kept
        the previous one (``retain_graph=True``) never sees it overwritten, and a training loop
        gets the same memory every step, with no page faults."""
        if _storage_use_count is None:  # a torch without the count: always fresh
            return like.new_empty(shape)
        key = "returned:" + name
        kept = self._buffers.get(key)
        if kept is not None and _uses(kept) != self._uses_when_made[key]:
            del self._buffers[key]  # someone holds it: hand out (and keep) a new one
        t = self._buffer(key, shape, like)
        self._uses_when_made[key] = _uses(t)
        return t

    def lease(self, ctx: Any) -> Alloc:
        """The allocator for ``ctx``'s forward: the workspace's if it is free, else fresh memory."""
        if self._holder is not None and self._holder() is not None:
            return fresh
        self._holder = weakref.ref(ctx)
        ctx.workspace = self
        return self._buffer

    def release(self, ctx: Any) -> None:
        if self._holder is not None and self._holder() is ctx:
            self._holder = None

    def clear(self) -> None:
        super().clear()
        self._uses_when_made.clear()
        self._holder = None


class Scratch(_Buffers):
    """Buffers for the temporaries of one backward at a time (gradients that die inside it).

    The blocks of a model share one (:func:`share_scratch`): autograd runs their backwards one
    after another, so the model holds one block's temporaries instead of one set per block.
    A backward that finds it borrowed (another thread's, or a nested one) gets fresh memory."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def borrow(self) -> Iterator[Alloc]:
        """The allocator for one backward's temporaries: these buffers if free, else fresh memory."""
        if not self._lock.acquire(blocking=False):
            yield fresh
            return
        try:
            yield self._buffer
        finally:
            self._lock.release()


def share_scratch(blocks: Iterable[nn.Module]) -> None:
    """Give every block among ``blocks`` (and their children) that has a ``scratch`` one shared
    :class:`Scratch`: their backwards run one at a time."""
    shared = Scratch()
    for blk in blocks:
        for mod in blk.modules():
            if isinstance(getattr(mod, "scratch", None), Scratch):
                mod.scratch = shared

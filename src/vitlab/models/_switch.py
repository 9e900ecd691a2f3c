"""Process-wide switches for the CPU fast paths (models/onednn.py, models/fused_block.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class Switch:
    """An on/off flag, on by default; :meth:`disabled` turns it off for a ``with`` block. It is
    process-wide: other threads running a model meanwhile see it off too."""

    def __init__(self) -> None:
        self.on = True

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        prev, self.on = self.on, False
        try:
            yield
        finally:
            self.on = prev


def running_eagerly() -> bool:
    """Not being traced, exported or compiled: those record one graph (for every batch size) and
    fuse on their own, so the eager-only fast paths stand aside."""
    return not torch.jit.is_tracing() and not torch.compiler.is_compiling() and not torch.onnx.is_in_onnx_export()

"""When a speed path may run: the master switch, the per-path switches, and the check that a
model is still exactly what the speed path was written for.

A speed path computes what the plain forward of :mod:`vitlab.models` computes, but it does so
without calling the submodules one by one. So it may run only where nothing could tell the
difference: no hooks that would not fire, no replaced or wrapped layers (adapters, quantised
layers, parametrizations) whose own forward would not run, no forward patched onto an
instance, no parameter sharding (FSDP2's ``fully_shard``), and no tracer that records the graph
itself. Everywhere else the plain forward runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.modules import module as _module

__all__ = [
    "Switch",
    "disabled",
    "enabled",
    "hooks_anywhere",
    "running_eagerly",
    "set_enabled",
    "sharded",
    "unchanged",
]


class Switch:
    """An on/off flag, on by default; :meth:`disabled` turns it off for a ``with`` block. It is
    process-wide: other threads running a model meanwhile see it off too."""

    def __init__(self, on: bool = True) -> None:
        self.on = on

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        prev, self.on = self.on, False
        try:
            yield
        finally:
            self.on = prev


_master = Switch(os.environ.get("VITLAB_ACCEL", "1") != "0")


def set_enabled(on: bool) -> None:
    """Turn every speed path of :mod:`vitlab.accel` on or off, process-wide. Off:
    ``vitlab.create_model`` and ``vitlab.load`` build the plain reference classes of
    :mod:`vitlab.models`, and models built earlier run their plain forward. The environment
    variable ``VITLAB_ACCEL=0`` starts a process with them off."""
    _master.on = bool(on)


def enabled() -> bool:
    """Whether the speed paths are on (:func:`set_enabled`)."""
    return _master.on


disabled = _master.disabled
"""``with vitlab.accel.disabled():`` runs the plain forward inside the block only."""


def running_eagerly() -> bool:
    """Not being traced (``torch.jit``, ``torch.fx``), exported or compiled: those record one graph
    (for every batch size) and fuse on their own, so the eager-only fast paths stand aside."""
    return not (
        torch.jit.is_tracing() or _fx_tracing() or torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export()
    )


def _fx_tracing() -> bool:
    fx = torch.fx._symbolic_trace
    check = getattr(fx, "is_fx_symbolic_tracing", None)  # newer torch; the older name warns there
    return check() if check is not None else fx.is_fx_tracing()


def _has_hooks(m: nn.Module) -> bool:
    return bool(
        m._forward_hooks
        or m._forward_pre_hooks
        or m._backward_hooks
        or m._backward_pre_hooks
        or getattr(m, "_forward_hooks_with_kwargs", None)
    )


def _global_hooks() -> bool:
    return bool(
        _module._global_forward_hooks
        or _module._global_forward_pre_hooks
        or _module._global_backward_hooks
        or _module._global_backward_pre_hooks
    )


def hooks_anywhere(model: nn.Module) -> bool:
    """Whether a hook is registered on ``model``, any module inside it, or every module."""
    return _global_hooks() or any(_has_hooks(m) for m in model.modules())


def sharded(m: nn.Module) -> bool:
    """Whether FSDP2 (``torch.distributed.fsdp.fully_shard``) manages ``m``: its class was swapped for an
    ``FSDP<name>`` subclass whose hooks gather the full parameters for each call and free them after.
    The speed paths keep per-layer state between calls (packed weights, activation buffers) that would
    hold the full weights the sharding exists to spread, and return views that FSDP's backward hooks
    warn about; a sharded module runs the plain forward. (No module is sharded until FSDP is imported.)"""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    cls = getattr(fsdp, "FSDPModule", None)
    return cls is not None and isinstance(m, cls)


def unchanged(root: nn.Module, expected: dict[str, type | tuple[type, ...]]) -> bool:
    """Whether the submodules of ``root`` are exactly ``expected`` (dotted name -> class, no
    subclasses, none added or missing), with no hooks, no ``forward`` set on an instance, and
    plain parameters, and ``root`` is not :func:`sharded`. Hooks on ``root`` itself are allowed:
    its own call still runs them."""
    if _global_hooks() or sharded(root):
        return False
    n = 0
    for name, m in root.named_modules():
        if not name:
            continue
        want = expected.get(name)
        if want is None or type(m) not in (want if isinstance(want, tuple) else (want,)):
            return False
        if _has_hooks(m) or "forward" in m.__dict__:
            return False
        for p in m._parameters.values():
            if p is not None and type(p) is not nn.Parameter:
                return False
        n += 1
    return n == len(expected) and "forward" not in root.__dict__

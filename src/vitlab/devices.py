"""Where a computation runs and in which precision: the one device resolver and the one
autocast helper of vitlab (commands, training, evaluation and benchmarks all use these)."""

from __future__ import annotations

import contextlib

import torch

from .errors import ConfigError

__all__ = ["autocast", "model_device", "resolve_device"]


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``; anything else as given, checked.

    Raises :class:`ConfigError` (one line) for a name torch does not know or a CUDA device on a
    machine without one."""
    if isinstance(name, torch.device):
        dev = name
    elif name.strip().lower() == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            dev = torch.device(name.strip())
        except RuntimeError:
            raise ConfigError(f"--device {name!r}: not a device name (auto, cpu, cuda, cuda:1 ...)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine")
    return dev


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (CPU for a model without parameters)."""
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``, or a no-op context when ``dtype`` is None
    (full float32). float16 autocast is for CUDA only (the CPU has no fast float16 GEMMs)."""
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    if dtype == torch.float16 and device.type == "cpu":
        raise ConfigError("float16 autocast is for CUDA; use bfloat16 on the CPU")
    return torch.autocast(device_type=device.type, dtype=dtype)

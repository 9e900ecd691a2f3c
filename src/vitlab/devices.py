"""Where a computation runs and in which precision: the one device resolver and the one
autocast helper of vitlab (commands, training, evaluation and benchmarks all use these)."""

from __future__ import annotations

import contextlib
import os

import torch

from .errors import ConfigError

__all__ = ["autocast", "cap_threads", "model_device", "resolve_device", "usable_cores"]


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


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cap_threads(n: int, *, flag: str = "--threads") -> tuple[int, str | None]:
    """``(threads, line)``: ``n`` CPU threads (``--threads``, every command's), at most the cores this process may
    run on (:func:`usable_cores`): more only wait for each other, and asking OpenMP for a thousand on two cores
    can end the process inside libgomp. ``line`` says so when ``n`` was capped (None otherwise)."""
    cores = usable_cores()
    if n <= cores:
        return n, None
    shown = f"{n:,}" if n < 10**12 else f"a {n.bit_length()}-bit number of"
    return cores, f"{flag} {shown}: capped at the {cores} core(s) this process may run on"

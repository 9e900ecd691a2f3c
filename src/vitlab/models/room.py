"""Whether a model fits before it is built: :meth:`ViTConfig.build_bytes` (arithmetic) against the memory this
process may still allocate, read from the kernel's files. A ``depth`` of 100,000 or an ``embed_dim`` of 10^8 is
refused in one line at once, instead of being built block by block until the machine runs out of memory."""

from __future__ import annotations

import resource
from pathlib import Path

import torch

from ..errors import ConfigError
from .config import ViTConfig

__all__ = ["check_buildable", "memory_room"]


def _read(path: str | Path, limit: int = 1 << 16) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return ""


def _meminfo_available() -> int | None:
    for line in _read("/proc/meminfo").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "MemAvailable:" and parts[1].isdigit():
            return int(parts[1]) * 1024
    return None


def _cgroup_room() -> int | None:
    """What this process's own cgroup (v2) still allows: ``memory.max`` less ``memory.current``; None: no limit."""
    for line in _read("/proc/self/cgroup").splitlines():
        if line.startswith("0::"):
            d = Path("/sys/fs/cgroup") / line[3:].strip().lstrip("/")
            limit, used = _read(d / "memory.max", 64).strip(), _read(d / "memory.current", 64).strip()
            if limit.isdigit() and used.isdigit():
                return max(0, int(limit) - int(used))
    return None


def _address_room() -> int | None:
    """What the soft ``RLIMIT_AS`` (``ulimit -v``) leaves above the process's virtual size; None: no limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    for line in _read("/proc/self/status").splitlines():
        if line.startswith("VmSize:") and line.split()[1].isdigit():
            return max(0, soft - int(line.split()[1]) * 1024)
    return soft


def memory_room() -> int | None:
    """Bytes this process may still allocate: the smallest of ``MemAvailable``, its cgroup's room and its address
    space limit's; None where none can be read (not Linux)."""
    found = [n for n in (_meminfo_available(), _cgroup_room(), _address_room()) if n is not None]
    return min(found) if found else None


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} PiB"


def check_buildable(cfg: ViTConfig) -> None:
    """Refuse to build ``cfg``'s model when building it would take more memory than this process may still allocate
    (:meth:`ViTConfig.build_bytes`: its float32 parameters, none on the meta device, and its blocks' objects):
    one :class:`ConfigError` line naming its size, before any module exists."""
    meta = torch.get_default_device().type == "meta"
    need = cfg.build_bytes(tensors=not meta and torch.get_default_device().type == "cpu")
    room = memory_room()
    if room is None or need <= room:
        return
    raise ConfigError(
        f"{cfg.name}: a model of {cfg.num_params():,} parameters in {cfg.depth:,} blocks of width {cfg.embed_dim:,} "
        f"needs ~{_size(need)} to build, more than the {_size(room)} this process can still allocate; "
        "choose a smaller depth, embed_dim or mlp_dim"
    )

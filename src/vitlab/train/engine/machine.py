"""How much memory this machine gives a run: the kernel's ``MemAvailable`` and the cgroup's limit less its usage
(v2 ``memory.max``, v1 ``memory.limit_in_bytes``), the smaller of them, from small bounded reads of kernel files;
on a GPU the device's free memory. :mod:`.memory` fits the run's batch into it."""

from __future__ import annotations

from pathlib import Path

import torch

from ..._units import format_size

__all__ = ["available_memory", "cgroup_available"]


def _read(path: str | Path, limit: int = 1 << 16) -> str | None:
    """A small kernel file's text (bounded), or None when it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return None


def _int_file(path: Path) -> int | None:
    text = _read(path, 64)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:  # "max": no limit
        return None


def _stat(path: Path, key: str) -> int:
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _meminfo_available() -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def _cgroup_dirs(base: Path, path: str) -> list[Path]:
    """``base/path`` and its parents up to ``base``: a limit on any of them applies."""
    d, dirs = base / path.strip("/"), []
    while True:
        if d.is_dir():
            dirs.append(d)
        if d == base or base not in d.parents:
            return dirs
        d = d.parent


def cgroup_available(
    *, proc: str | Path = "/proc/self/cgroup", root: str | Path = "/sys/fs/cgroup"
) -> list[tuple[int, str]]:
    """``(bytes left, which limit)`` for every cgroup memory limit over this process (``proc`` lists its cgroups,
    ``root`` is where they are mounted): the limit less the usage, where the usage leaves out inactive file
    cache (the kernel reclaims it before it kills)."""
    found = []
    for line in (_read(proc) or "").splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            base, files = Path(root), ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base = Path(root) / "memory"
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        for d in _cgroup_dirs(base, path):
            limit = _int_file(d / files[0])
            if limit is None or limit >= 1 << 60:  # v1 writes "no limit" as a number near 2**63
                continue
            used = (_int_file(d / files[1]) or 0) - _stat(d / "memory.stat", files[2])
            found.append((max(0, limit - max(0, used)), f"cgroup {files[0]} {format_size(limit)}"))
    return found


def available_memory(device: torch.device) -> tuple[int, str] | None:
    """``(bytes, where from)`` this process may still allocate: a GPU's free memory, or on a CPU the smaller of
    ``MemAvailable`` and the cgroup limits' room; None where neither can be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free on {device}"
    found = cgroup_available()
    if (avail := _meminfo_available()) is not None:
        found.append((avail, "MemAvailable"))
    return min(found) if found else None

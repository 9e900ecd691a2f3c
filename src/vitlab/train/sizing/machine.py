"""What this machine gives a run: its free memory (:func:`available_memory`) and its free cores, from which the
CPU threads and DataLoader workers are chosen.

**Memory**: the kernel's ``MemAvailable`` and the cgroup's limit less its usage (v2 ``memory.max``, v1
``memory.limit_in_bytes``), the smaller of them, from small bounded reads of kernel files; on a GPU the device's free
memory. :mod:`.memory` fits the run's batch into it.

**Threads and workers**, chosen from the cores actually free.

torch's CPU kernels split each parallel region over its threads and wait for the slowest at its end. When another
process holds one of two cores, the thread that shares that core arrives late at every barrier, and the run goes at
a fraction of its share of the machine, less than one thread alone would make (docs/training.md, "Threads on a busy
machine"). So the thread count follows the cores that are free, not the cores there are:

- ``--threads N``: N, never changed; at most the cores this process may run on (:func:`vitlab.devices.cap_threads`,
  every command's rule: OpenMP asked for a thousand threads on two cores can end the process in libgomp);
- otherwise, on the CPU: 1 when a training step is small (under :data:`TINY_STEP_MACS`: its kernels lose more to
  synchronisation than they gain); else the cores of this process's affinity mask that are idle over
  :data:`SAMPLE_S` seconds of ``/proc/stat`` (each core counts its idle share; a core counts as free from 75% idle),
  at least 1, at most the cgroup's CPU quota and ``OMP_NUM_THREADS`` when set, divided among the processes of a
  ``torchrun`` node (the run's first lines say what was chosen and why, :func:`threads_line`);
- one DataLoader worker when the model runs on one thread and another core is free (on a GPU: always one);
- re-checked at an epoch's end (:class:`ThreadWatch`): when the epoch ran at under half the previous one's pace,
  the free cores are sampled again and the threads lowered if fewer are free now; with fewer threads than the cap
  (a lowering, or a start on a busy machine), an epoch at over 1.5x the previous pace samples again and goes up to
  the cores free then (never above the cap).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..._units import format_size
from ...devices import cap_threads
from ..conf.train_config import TrainConfig

__all__ = [
    "SAMPLE_S",
    "TINY_STEP_MACS",
    "WORKER_MIN_STEPS",
    "ThreadWatch",
    "allowed_cpus",
    "available_memory",
    "cgroup_available",
    "cgroup_cores",
    "choose_threads",
    "cpu_times",
    "fix_threads",
    "free_cores",
    "set_threads",
    "thread_cap",
    "threads_line",
    "workers_for",
]

STAT = "/proc/stat"
CPU_MAX = "/sys/fs/cgroup/cpu.max"
SAMPLE_S = 0.2
"""Seconds between the two readings of ``/proc/stat`` that measure which cores are idle."""
TINY_STEP_MACS = 2e9
"""Multiply-accumulates of a training step (3 x the forward's, the micro-batch) under which one thread is used."""
WORKER_MIN_STEPS = 50
"""Optimizer steps an epoch must hold before a CPU run takes a DataLoader worker by itself. The loader starts its
worker afresh every epoch, and epochs of a few small steps pay that at every one: a fine-tune on 21 photos (epochs of
2 steps of 8 at 64 px) made 502 steps in a 1-minute budget with the worker and 1,032 without; on 200 photos (22
steps an epoch) it trained at 302 and 322 img/s with it, 363 and 411 without; at 224 px, 60 and 59 against 57 and
65 (docs/training.md, "Threads on a busy machine"). No run measured a worker ahead."""
FREE_FROM = 0.75
"""The idle share from which a core counts as free: ``floor(idle cores + 1 - FREE_FROM)``."""
COLLAPSE, RECOVER = 0.5, 1.5
"""An epoch at under ``COLLAPSE`` x the previous one's pace re-samples the free cores; one at over ``RECOVER`` x,
after the threads were lowered, too."""
_MEMO_S = 30.0
"""A sample this recent is reused (the run's probe and its model choose threads a few seconds apart)."""
_memo: list[tuple[float, float | None]] = []


def _read_stat() -> str | None:
    """The text of ``/proc/stat`` (at most 1 MiB), or None where there is none (not Linux)."""
    try:
        with open(STAT, encoding="ascii", errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return None


def _read_cpu_max() -> str | None:
    """The text of this process's cgroup v2 ``cpu.max`` (at most 256 bytes), or None where there is none."""
    try:
        with open(CPU_MAX, encoding="ascii", errors="replace") as f:
            return f.read(256)
    except OSError:
        return None


def cpu_times(text: str) -> dict[int, tuple[int, int]]:
    """Per CPU ``(idle, total)`` clock ticks from the text of ``/proc/stat`` (its ``cpuN`` lines: user, nice,
    system, idle, iowait, irq, softirq, steal; idle counts iowait too). Lines that do not parse are skipped."""
    out: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        try:
            v = [int(x) for x in rest.split()[:8]]
        except ValueError:
            continue
        if len(v) >= 4:
            out[int(name[3:])] = (v[3] + (v[4] if len(v) > 4 else 0), sum(v))
    return out


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity mask; every CPU where there is none)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def free_cores(
    *,
    read: Callable[[], str | None] = _read_stat,
    sleep: Callable[[float], None] = time.sleep,
    cpus: set[int] | None = None,
    interval: float = SAMPLE_S,
) -> float | None:
    """How many of ``cpus`` (default: :func:`allowed_cpus`) were idle over ``interval`` seconds: the sum of each
    one's idle share of the ticks between two readings of ``/proc/stat``. None when it cannot be read."""
    first = read()
    sleep(interval)
    second = read()
    if first is None or second is None:
        return None
    a, b = cpu_times(first), cpu_times(second)
    free, seen = 0.0, 0
    for c in cpus if cpus is not None else allowed_cpus():
        if c in a and c in b:
            idle, total = b[c][0] - a[c][0], b[c][1] - a[c][1]
            free += min(1.0, max(0.0, idle / total)) if total > 0 else 1.0
            seen += 1
    return free if seen else None


def _sample_free_cores() -> float | None:
    """:func:`free_cores`, reused when sampled within the last :data:`_MEMO_S` seconds."""
    now = time.monotonic()
    if _memo and now - _memo[0][0] < _MEMO_S:
        return _memo[0][1]
    free = free_cores()
    _memo[:] = [(time.monotonic(), free)]
    return free


def cgroup_cores(read: Callable[[], str | None] = _read_cpu_max) -> float | None:
    """The cores a cgroup v2 CPU quota allows (``cpu.max``: ``QUOTA PERIOD`` in microseconds, or ``max``: none),
    or None when there is no quota or it cannot be read. A container limited to 1.5 CPUs answers 1.5."""
    text = read()
    parts = text.split() if text else []
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def thread_cap(*, quota: float | None = None) -> int:
    """The most threads a run takes: this process's CPUs, at most its cgroup's CPU quota (``quota``, default
    :func:`cgroup_cores`; rounded up), at most ``OMP_NUM_THREADS`` when it is set, shared among the processes of a
    ``torchrun`` node (``LOCAL_WORLD_SIZE``)."""
    cap = len(allowed_cpus())
    quota = cgroup_cores() if quota is None else quota
    if quota is not None:
        cap = min(cap, max(1, math.ceil(quota)))
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        cap = min(cap, int(omp))
    local = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return max(1, cap // max(1, int(local) if local.isdigit() else 1))


def _usable(free: float | None, *, processes: int = 1) -> int | None:
    """Whole free cores for this process, or None when unknown."""
    return None if free is None else max(1, math.floor(free + 1 - FREE_FROM) // max(1, processes))


def choose_threads(*, cap: int, free: float | None, step_macs: float) -> int:
    """Threads for a training step of ``step_macs`` multiply-accumulates with ``free`` idle cores (None: unknown)
    and at most ``cap``: 1 for a small step, else the free cores, at least 1."""
    if step_macs < TINY_STEP_MACS:
        return 1
    local = os.environ.get("LOCAL_WORLD_SIZE", "1")
    usable = _usable(free, processes=int(local) if local.isdigit() else 1)
    return cap if usable is None else max(1, min(cap, usable))


@dataclass(kw_only=True)
class ThreadWatch:
    """The run's CPU threads after the start (see the module's notes): :meth:`after_epoch` re-checks them when
    the pace collapses, and goes back up when it recovers."""

    threads: int
    """Threads now."""
    chosen: int
    """The start's choice."""
    fixed: bool = False
    """``--threads`` given, or not on the CPU: never changed."""
    step_macs: float = math.inf
    cap: int = 1
    """The most threads (:func:`thread_cap`): a recovery goes up to the free cores, no further than this."""
    last_pace: float | None = None
    """Seconds per step of the previous epoch."""
    sample: Callable[[], float | None] = free_cores
    """A fresh sample of the free cores."""
    set_threads: Callable[[int], None] = torch.set_num_threads

    @classmethod
    def for_run(
        cls, cfg: TrainConfig, *, device: torch.device, step_macs: float, replayed: bool = False
    ) -> ThreadWatch:
        """The watch of a run whose threads :func:`set_threads` chose (torch's count now is its choice); fixed when
        the user set them, off the CPU, for a tiny step, and in a replay (it keeps the threads it replays)."""
        n = torch.get_num_threads()
        fixed = cfg.threads > 0 or device.type != "cpu" or step_macs < TINY_STEP_MACS or replayed
        return cls(threads=n, chosen=n, fixed=fixed, step_macs=step_macs, cap=thread_cap())

    def after_epoch(self, per_step: float) -> str | None:
        """After an epoch whose steps took ``per_step`` seconds: the line saying the threads changed, else None."""
        last, self.last_pace = self.last_pace, per_step
        if self.fixed or last is None or per_step <= 0:
            return None
        collapsed = per_step > last / COLLAPSE
        recovered = per_step < last / RECOVER and self.threads < self.cap
        if not (collapsed or recovered):
            return None
        free = self.sample()
        want = choose_threads(cap=self.cap, free=free, step_macs=self.step_macs)
        if (collapsed and want >= self.threads) or (recovered and want <= self.threads):
            return None
        old, self.threads = self.threads, want
        self.set_threads(want)
        how = "under half" if collapsed else "over 1.5x"
        return (
            f"cpu: the last epoch ran at {how} the previous one's pace and {free or 0:.1f} of {len(allowed_cpus())} "
            f"core(s) are free now -> {want} torch thread(s) (was {old})"
        )


def set_threads(cfg: TrainConfig, *, device: torch.device, step_macs: float) -> ThreadWatch:
    """Set torch's CPU threads for a run whose training step costs ``step_macs`` (see the module's notes) and
    return the watch that re-checks them."""
    if cfg.threads > 0:
        n, _ = cap_threads(cfg.threads)
        torch.set_num_threads(n)
        return ThreadWatch(threads=n, chosen=n, fixed=True)
    if device.type != "cpu":
        n = torch.get_num_threads()
        return ThreadWatch(threads=n, chosen=n, fixed=True)
    cap = thread_cap()
    n = choose_threads(cap=cap, free=_sample_free_cores() if step_macs >= TINY_STEP_MACS else None,
                       step_macs=step_macs)  # fmt: skip
    torch.set_num_threads(n)
    return ThreadWatch(threads=n, chosen=n, step_macs=step_macs, cap=cap)


def fix_threads(n: int, *, device: torch.device) -> int:
    """Set torch's CPU threads to ``n`` (a replayed run's: the same threads give the same sums, so the same
    weights), at most :func:`thread_cap`; on a GPU torch's own count is kept. Returns the count set."""
    if device.type != "cpu":
        return torch.get_num_threads()
    n = max(1, min(n, thread_cap()))
    torch.set_num_threads(n)
    return n


def threads_line(cfg: TrainConfig, *, device: torch.device, workers: int, step_macs: float) -> str | None:
    """The line a CPU run states its threads and workers in, and why (None on a GPU), after :func:`set_threads`
    and :func:`workers_for` chose them for a step of ``step_macs``."""
    if device.type != "cpu":
        return None
    n, cpus = torch.get_num_threads(), len(allowed_cpus())
    if cfg.threads > 0:
        why = cap_threads(cfg.threads)[1] or "--threads"
    elif step_macs < TINY_STEP_MACS:
        why = "a small step loses more to synchronising threads than it gains; --threads N to choose"
    else:
        free = _memo[0][1] if _memo else None
        why = f"{free:.1f} of {cpus} core(s) free at start" if free is not None else "the free cores unknown"
        quota = cgroup_cores()
        why += f", a CPU quota of {quota:g}" if quota is not None else ""
        why += "; --threads N to choose"
    return f"cpu: {n} torch thread(s) ({why}), {workers} DataLoader worker(s)"


def workers_for(cfg: TrainConfig, *, device: torch.device, steps_per_epoch: int) -> int:
    """DataLoader workers: ``--workers`` when given; else one on a GPU, and one on the CPU when torch runs one
    thread, another core is free (the augmentation then runs beside the steps) and an epoch holds at least
    :data:`WORKER_MIN_STEPS` optimizer steps (``steps_per_epoch``)."""
    if cfg.workers >= 0:
        return cfg.workers
    if device.type == "cuda":
        return 1
    if torch.get_num_threads() != 1 or steps_per_epoch < WORKER_MIN_STEPS:
        return 0
    usable = _usable(_sample_free_cores())
    return int((usable if usable is not None else len(allowed_cpus())) >= 2)


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

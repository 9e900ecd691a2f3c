""":func:`time_calls`: plain callables timed the way :func:`~vitlab.bench.benchmark` times two models, for what
is not a registered model's step (a decoder, an exported model, one attention kernel, a loader's next batch).

Each round calls every callable once, in turn; the order alternates from round to round (as :func:`benchmark`
alternates its two sides), so that a load that comes and goes on a shared machine falls on each of them alike and
a per-round ratio compares moments that were close together. Each call is timed alone, the device synchronised on
both sides of it, with the page faults it took (:func:`~vitlab.bench.workers.minor_faults`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .workers import timed_call

__all__ = ["CallTimes", "time_calls"]


@dataclass(frozen=True)
class CallTimes:
    """What the timed rounds of one callable took: seconds and minor page faults per call (a fault count None where
    the platform cannot count them), in the order of the rounds."""

    seconds: tuple[float, ...]
    faults: tuple[int | None, ...]

    @property
    def median(self) -> float:
        """The median seconds of a call."""
        return statistics.median(self.seconds)


def time_calls(
    calls: Mapping[str, Callable[[], object]],
    *,
    rounds: int,
    warmup: int = 0,
    alternate: bool = True,
    setup: Callable[[str, int], object] | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, CallTimes]:
    """Call each of ``calls`` once a round, ``warmup`` rounds untimed then ``rounds`` timed, and return what the
    timed calls took, by name (in the order of ``calls``).

    ``alternate``: round ``r`` (warm-up rounds counted) calls them in the given order when ``r`` is even and in
    reverse when it is odd; False keeps the given order every round. ``setup(name, r)`` runs before each call,
    outside its timing (a seed for the call's random draws, fresh inputs). ``device``: the one the callables run
    on, synchronised before and after each call so that its queued work is inside the timing."""
    if rounds <= 0 or warmup < 0:
        raise ConfigError(f"time_calls: rounds must be positive and warmup >= 0, got {rounds} and {warmup}")
    if not calls:
        raise ConfigError("time_calls: no callables to time")
    dev = torch.device(device)
    names = list(calls)
    seconds: dict[str, list[float]] = {k: [] for k in names}
    faults: dict[str, list[int | None]] = {k: [] for k in names}
    for r in range(warmup + rounds):
        for name in names[::-1] if alternate and r % 2 else names:
            if setup is not None:
                setup(name, r)
            dt, nf = timed_call(calls[name], dev)
            if r >= warmup:
                seconds[name].append(dt)
                faults[name].append(nf)
    return {k: CallTimes(seconds=tuple(seconds[k]), faults=tuple(faults[k])) for k in names}

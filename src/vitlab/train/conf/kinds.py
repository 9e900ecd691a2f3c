"""How an option's value is spelled (:class:`Kind`): on the command line (argparse's ``type``, or text read after
parsing) and in a config file (numbers, lists, or the text the flag takes). A bad value is a ``ValueError`` (or
argparse's ``ArgumentTypeError``) saying what is wrong; the option table names the option."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..._units import parse_size
from ...track import BACKENDS

__all__ = [
    "DURATION",
    "FLAG",
    "FLOAT",
    "INT",
    "LOGGERS",
    "MAPPING",
    "NAMES",
    "PAIR",
    "RANDAUGMENT",
    "RES_SCHEDULE",
    "SIZE",
    "TEXT",
    "Kind",
    "Schedule",
    "check_res_schedule",
    "parse_duration",
    "read_res_schedule",
]


def parse_duration(text: str) -> float:
    """``20m`` / ``90s`` / ``1.5h`` / ``7d`` / ``1200`` (seconds) -> seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhd]?)\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 20m, 90s, 1h or 7d")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _finite(text: str) -> float:
    """A number's text as a float; NaN and infinities are no value of any option (``--lr nan``, ``--pack-res
    4,inf``): refused here, in argparse's one line, before anything computes with them."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number")
    return v


def _pair(text: str) -> tuple[float, float]:
    parts = [_finite(v) for v in str(text).replace(",", " ").split()]
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"{text!r}: expected two numbers like 0.08,1")
    return parts[0], parts[1]


def _randaugment(text: str) -> tuple[int, int] | str:
    if str(text).lower() in ("none", "off", "0"):
        return "none"
    parts = str(text).replace(",", " ").split()
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NUM_OPS,MAGNITUDE like 2,9 (or 'none')")
    return int(parts[0]), int(parts[1])


def _loggers(text: str) -> list[str]:
    """``--log``'s text (``csv,tensorboard``) as the logger names, lower-cased, in order, each once."""
    names = [n.strip().lower() for n in str(text).split(",") if n.strip()]
    for n in names:
        if n not in BACKENDS:
            raise argparse.ArgumentTypeError(f"unknown logger {n!r}; choose from {', '.join(BACKENDS)}")
    return list(dict.fromkeys(names))


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*")


def _names(text: str) -> tuple[str, ...]:
    """``--lora-targets``' text (``qkv,proj``) as module names, in order, each once."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected module names like qkv,proj")
    for n in names:
        if not _MODULE_NAME.fullmatch(n):
            raise argparse.ArgumentTypeError(f"{n!r}: not a module name (letters, digits, _ and dots, like attn.qkv)")
    return tuple(dict.fromkeys(names))


def _is_names(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(n, str) and _MODULE_NAME.fullmatch(n) for n in v)


def _number(v: Any) -> bool:
    """A finite int or float (a config file's ``.nan`` or ``1e400`` is none)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


Schedule = tuple[tuple[int, float], ...]
"""A resolution schedule: ``((size, end fraction), ...)``: ``size`` px until ``end`` of the planned steps; the last
end is 1."""


def read_res_schedule(text: str) -> Schedule:
    """``"24:0.5,32:1.0"`` -> ``((24, 0.5), (32, 1.0))``: 24 px for the first half of the steps, then 32.
    Sizes are positive integers, the fractions increase and the last is 1."""
    out: list[tuple[int, float]] = []
    for part in str(text).split(","):
        size, sep, end = part.strip().partition(":")
        try:
            item = (int(size), float(end))
        except ValueError:
            item = None
        if not sep or item is None:
            raise ValueError(f"expected SIZE:FRACTION[,SIZE:FRACTION...] (e.g. 24:0.5,32:1.0), got {text!r}")
        out.append(item)
    return check_res_schedule(out)


def check_res_schedule(schedule: object) -> Schedule:
    """``schedule`` (pairs, e.g. from a saved recipe's JSON) as a validated tuple of ``(size, end)``."""
    try:
        pairs = tuple((int(s), float(e)) for s, e in schedule)  # type: ignore[union-attr, misc]
    except (TypeError, ValueError):
        raise ValueError(f"expected pairs of (size, end fraction), got {schedule!r}") from None
    if not pairs:
        raise ValueError("empty")
    prev = 0.0
    for size, end in pairs:
        if not 0 < size < 1 << 16:
            raise ValueError(f"size {size} is out of range [1, 65536)")
        if not prev < end <= 1.0:
            raise ValueError(f"the fractions must increase within (0, 1], got {end} after {prev}")
        prev = end
    if pairs[-1][1] != 1.0:
        raise ValueError(f"the last fraction must be 1.0 (the end of training), got {pairs[-1][1]}")
    return pairs


@dataclass(frozen=True)
class Kind:
    """How a value is spelled. ``parse``: the command line's text (argparse's ``type``: a bad value is argparse's
    own one-line error); ``late``: the text read after parsing (a bad value is an :class:`OptionError`); ``check``:
    a config file's value (a number, a list ...), which may also be the text the flag takes."""

    what: str
    check: Callable[[Any], bool]
    convert: Callable[[Any], Any] = lambda v: v
    parse: Callable[[str], Any] | None = None
    late: Callable[[str], Any] | None = None
    sep: str = ": "
    """Between the option's name and what is wrong with its text: ``--res-schedule: expected ...``,
    ``--memory-budget '64X' is not a size ...``."""

    def from_file(self, value: Any) -> Any:
        """A config file's value as the option holds it; ``ValueError`` (its message) when it is none."""
        if isinstance(value, str) and (self.parse or self.late) and not self.check(value):
            try:
                value = (self.parse or self.late)(value)  # type: ignore[misc]
            except argparse.ArgumentTypeError as e:
                raise ValueError(str(e)) from None
            except ValueError as e:  # int("many"): say what was expected; a parser of ours says what is wrong
                raise ValueError(
                    f"expected {self.what}, got {value!r}" if self.parse in (int, float) else str(e)
                ) from None
        if not self.check(value):
            raise ValueError(f"expected {self.what}, got {_describe(value)}")
        return self.convert(value)


def _describe(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_pair(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) == 2 and all(_number(x) for x in v)


TEXT = Kind("a string", lambda v: isinstance(v, str))
FLAG = Kind("true or false", lambda v: isinstance(v, bool))
INT = Kind("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool), parse=int)
FLOAT = Kind("a finite number", _number, float, parse=_finite)
DURATION = Kind("seconds or a duration like 20m", lambda v: _number(v) and v > 0, float, parse=parse_duration)
SIZE = Kind(
    "bytes or a size like 64M", lambda v: isinstance(v, int) and not isinstance(v, bool), late=parse_size, sep=" "
)
PAIR = Kind("two numbers", _is_pair, lambda v: (float(v[0]), float(v[1])), parse=_pair)
RANDAUGMENT = Kind(
    "NUM_OPS,MAGNITUDE or none",
    lambda v: v == "none" or (isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) for x in v)),
    lambda v: v if v == "none" else (int(v[0]), int(v[1])),
    parse=_randaugment,
)
RES_SCHEDULE = Kind(
    "pairs of (size, end fraction)",
    lambda v: isinstance(v, (list, tuple)),
    check_res_schedule,
    late=read_res_schedule,
)
LOGGERS = Kind(
    "logger names (" + ", ".join(BACKENDS) + ")",
    lambda v: isinstance(v, list) and all(isinstance(n, str) and n in BACKENDS for n in v),
    parse=_loggers,
)
NAMES = Kind("module names like qkv,proj", _is_names, lambda v: tuple(dict.fromkeys(v)), parse=_names)
MAPPING = Kind(
    "a mapping of model fields", lambda v: isinstance(v, Mapping) and all(isinstance(k, str) for k in v), dict
)

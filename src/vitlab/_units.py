"""Quantities as people write them: sizes for command-line options (``--memory-budget 2G``), and counts in
messages (``1 epoch``, ``2 epochs``).

One parser, so every command accepts the same spellings and rejects the same garbage.
"""

from __future__ import annotations

import re

__all__ = ["counted", "duration", "format_size", "parse_size", "size_option"]

_UNITS = {
    "": 1,
    "b": 1,
    **{p + suffix: 1024**i for i, p in enumerate("kmgt", start=1) for suffix in ("", "ib")},
    **{p + "b": 1000**i for i, p in enumerate("kmgt", start=1)},
}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?(?:ib|b)?)\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from ``512M``, ``2G``, ``64MiB``, ``1.5g`` or a plain number of bytes (``1048576``).

    ``K``/``M``/``G``/``T`` and ``KiB``/``MiB``/``GiB``/``TiB`` are powers of 1024 (as in Docker
    and Java's ``-Xmx``); ``kB``/``MB``/``GB``/``TB`` are powers of 1000 (SI). Case is ignored.
    Raises ``ValueError`` for anything else and for sizes under one byte."""
    m = _SIZE.fullmatch(str(text))
    scale = _UNITS.get(m.group(2).lower()) if m else None
    value = round(float(m.group(1)) * scale) if m and scale else 0
    if value < 1:
        raise ValueError(f"{text!r} is not a size like 512M, 2G, 64MiB or a number of bytes (1 or more)")
    return value


def size_option(flag: str, text: str | None) -> int | None:
    """:func:`parse_size` for the command-line option ``flag`` (``None`` stays ``None``): a bad
    value is a :class:`~vitlab.errors.ConfigError` naming the option, which the CLI prints on one line (exit 2)."""
    from .errors import ConfigError

    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as e:
        raise ConfigError(f"{flag} {e}") from None


def format_size(n: int) -> str:
    """``n`` bytes for a message, in powers of 1024: ``512 B``, ``343.4 KiB``, ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


def duration(seconds: float) -> str:
    """Seconds for a message: ``0.2 s``, ``45 s``, ``3.2 min``, ``1.5 h`` (under a second with a tenth: a short run's
    expected wall time is not "~0 s")."""
    if seconds < 0.95:
        return f"{max(seconds, 0.1):.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def counted(n: float, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` in the number they agree with: ``1 epoch``, ``2 epochs``, ``0 passes``, ``1,024 images``
    (``plural``: when not ``noun + "s"``; a ``noun`` ending in s, x, sh or tch takes ``es``: passes, patches,
    but epochs). Whole numbers print with thousands separators, others with up to 3 significant digits."""
    if plural is None:
        plural = noun + ("es" if noun.endswith(("s", "x", "sh", "tch")) else "s")
    shown = f"{int(n):,}" if float(n).is_integer() else f"{n:.3g}"
    return f"{shown} {noun if shown == '1' else plural}"

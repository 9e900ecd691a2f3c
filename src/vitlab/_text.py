"""Text from files as it may be printed: a file name with bytes that are not UTF-8, a class name or a path holding
the control characters a terminal acts on. Import-light (the CLI's error line uses it)."""

from __future__ import annotations

import os
import re
import shlex

__all__ = ["readable", "shell_word", "shown", "shown_lines", "size_px"]

# Characters a terminal acts on instead of showing: C0 and C1 controls (ESC starts the escape sequences that move
# the cursor, recolour, retitle the window or rewrite the line), DEL, the line and paragraph separators, and the
# bidirectional overrides and isolates that make text read in another order than it is stored ("Trojan source").
_ACTIVE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def readable(name: str | bytes) -> str:
    """A file name as printable, writable text: bytes that are not UTF-8 (which ``os.fsdecode`` keeps as
    surrogates, and which any ``print`` or ``write_text`` would fail on) are shown as ``\\xff``."""
    raw = name if isinstance(name, bytes) else os.fsencode(name)
    return raw.decode("utf-8", "backslashreplace")


def shown(text: object) -> str:
    """Text read from files (a class name, a path, a name in a model's config) as it may reach a terminal:
    :func:`readable` (undecodable bytes as ``\\xff``), and every character a terminal would act on instead of
    showing (controls such as ESC, DEL, bidirectional overrides) written as its escape, ``\\x1b`` or ``\\u202e``.
    Every command prints names and paths from files through it; JSON output escapes them by itself."""
    text = str(text)
    try:
        s = readable(text)
    except UnicodeEncodeError:  # a lone surrogate that no file name decodes to (from a JSON file's \\ud800)
        s = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _ACTIVE.sub(_escape, s)


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def shown_lines(text: object) -> str:
    """:func:`shown` of each line of a message vitlab writes over several lines (the end of a run's advice and its
    notes): its own line breaks kept, every other character a terminal acts on escaped."""
    return "\n".join(shown(line) for line in str(text).split("\n"))


def shell_word(text: object) -> str:
    """A path as one word of a command line vitlab suggests (``Continue with: vitlab train --out 'my runs/x'
    --resume``): quoted only where a shell would split or expand it (spaces, braces, ``$``), so the line can be
    copied as it is, and :func:`shown`."""
    return shown(shlex.quote(str(text)))


def size_px(size: tuple[int, int] | list[int]) -> str:
    """A model's input size ``(height, width)`` as the lines print it: ``64x64 px``, and a non-square one with each
    side named, ``height 40 x width 50 px``: the model's (and timm's) order is the reverse of a picture's, whose
    ``50x40`` is width x height, so the two would otherwise read as a turned image."""
    h, w = size
    return f"{h}x{w} px" if h == w else f"height {h} x width {w} px"

"""A ``--data`` shard spelling checked before anything is opened: which URL schemes it may use, how many shard
names its braces may expand to, and that it names each shard once.

``--data`` may come from a file, not only from the command line: ``--resume`` takes it from ``last.pt``. So a
spelling is treated as data, never as code. ``pipe:`` URLs, which ``webdataset.gopen`` runs through the shell,
are read only when the caller says the value was typed on this command line with ``--allow-pipe``
(``allow_pipe=True``); every other scheme must be one of :data:`URL_SCHEMES`, which open a stream without a
shell. A brace pattern is counted arithmetically (:func:`count_names`, the grammar of ``braceexpand``, which
``webdataset`` uses) and refused above :data:`MAX_SHARD_NAMES` names before a single name is made.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from ...errors import DataError

__all__ = ["MAX_SHARD_NAMES", "URL_SCHEMES", "count_names", "expand_spec", "quoted", "url_scheme"]

MAX_SHARD_NAMES = 1_000_000
"""Most shard names one ``--data`` value may expand to (braces and ``::`` lists together)."""
MAX_SPEC_CHARS = 1 << 20
"""Longest ``--data`` value read (1 MiB of text: a ``::`` list of many thousands of paths)."""
MAX_BRACE_DEPTH = 32
"""Most braces nested in one pattern (``braceexpand`` recurses once a level)."""
URL_SCHEMES = frozenset({"file", "http", "https", "gs", "s3", "hf", "htgs", "sftp", "ftps", "scp", "ais"})
"""Schemes a ``--data`` value may use from anywhere: ``webdataset.gopen`` opens each with a fixed program and
the URL as one argument (``curl``, ``gsutil`` ...), never through a shell. ``pipe:`` is not one of them."""

_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*):", re.IGNORECASE)
_DRIVE = re.compile(r"^[a-z]:[\\/]", re.IGNORECASE)
_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")  # braceexpand's own
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def quoted(spec: str, limit: int = 160) -> str:
    """``spec`` as one printable line for an error message: control characters escaped, long values cut."""
    s = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in spec)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def url_scheme(name: str) -> str | None:
    """The lower-case scheme of ``name`` (``https``, ``pipe`` ...), or None for a local path (``C:\\`` too)."""
    s = name.strip()
    m = _SCHEME.match(s)
    return None if m is None or _DRIVE.match(s) else m.group(1).lower()


class _TooMany(Exception):
    pass


def _check_depth(pattern: str, where: str) -> None:
    depth = top = pos = 0
    while pos < len(pattern):
        c = pattern[pos]
        if c == "\\":
            pos += 2
            continue
        depth += (c == "{") - (c == "}")
        top = max(top, depth)
        pos += 1
    if top > MAX_BRACE_DEPTH:
        raise DataError(f"{where}: braces nested {top} deep; at most {MAX_BRACE_DEPTH} levels are expanded")


def count_names(pattern: str, *, cap: int = MAX_SHARD_NAMES, where: str = "--data") -> int:
    """How many names ``braceexpand(pattern)`` yields, computed without making them (``{0..99}``: 100, nested
    and adjacent braces multiply and add as they expand). A count above ``cap`` is a :class:`DataError`."""
    _check_depth(pattern, where)
    try:
        return _pattern(pattern, cap)
    except _TooMany:
        raise DataError(
            f"{where}: the pattern expands to more than {cap:,} shard names; name fewer shards "
            "(or pack the data into larger ones: vitlab data pack --shard-size)"
        ) from None
    except ValueError as e:  # unbalanced braces, a number too long to read
        raise DataError(f"{where}: not a shard pattern ({e})") from None


def _capped(n: int, cap: int) -> int:
    if n > cap:
        raise _TooMany
    return n


def _pattern(p: str, cap: int) -> int:
    """``braceexpand.parse_pattern``'s walk, counting: the product of its parts."""
    start = pos = depth = 0
    total = 1
    while pos < len(p):
        c = p[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "{":
            if depth == 0:
                start = pos
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                expr = p[start + 1 : pos]
                n = _expression(expr, cap)
                total = _capped(total * (n if n is not None else _pattern(expr, cap)), cap)
                start = pos + 1
        pos += 1
    if depth != 0:
        raise ValueError("unbalanced braces")
    return total


def _expression(expr: str, cap: int) -> int | None:
    """A range's or a sequence's count; None when ``expr`` is neither (its braces are then literal)."""
    if m := _INT_RANGE.match(expr):
        a, b, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1) or 1
        return _capped(abs(b - a) // step + 1, cap)  # len(range(a, b + 1, step)), or down from a to b
    if m := _CHAR_RANGE.match(expr):
        a, b, step = _ALPHABET.index(m.group(1)), _ALPHABET.index(m.group(2)), int(m.group(3) or 1) or 1
        return len(_ALPHABET[a : b + 1 : step]) if a < b else len(_ALPHABET[a : (b or -len(_ALPHABET)) - 1 : -step])
    items, start, pos, depth = [], 0, 0, 0
    while pos < len(expr):
        c = expr[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            items.append(expr[start:pos])
            start = pos + 1
        pos += 1
    if depth != 0 or not items:
        return None
    items.append(expr[start:])
    total = 0
    for item in items:
        total = _capped(total + _pattern(item, cap), cap)
    return total


def _env_substituted(part: str, where: str) -> str:
    """``${NAME}`` replaced by ``$WDS_NAME`` as ``webdataset.shardlists.expand_urls`` does (up to 10 rounds)."""
    for _ in range(10):
        missing = [n for n in re.findall(r"\$\{(\w+)\}", part) if f"WDS_{n}" not in os.environ]
        if missing:
            raise DataError(f"{where}: ${{{missing[0]}}} needs the environment variable WDS_{missing[0]}")
        new = re.sub(r"\$\{(\w+)\}", lambda m: os.environ[f"WDS_{m.group(1)}"], part)
        if new == part:
            break
        part = new
    return part


def expand_spec(spec: str, *, allow_pipe: bool = False) -> list[str]:
    """The shard names of a pattern or ``::`` list, as ``webdataset`` expands them, after checking the value:
    its length, the number of names (:func:`count_names`, before expanding), each name's scheme (``pipe:``
    only with ``allow_pipe``) and that no shard is named twice (:func:`check_unique`)."""
    where = f"--data {quoted(spec)}"
    if len(spec) > MAX_SPEC_CHARS:
        raise DataError(f"--data: {len(spec):,} characters, more than the {MAX_SPEC_CHARS:,} read")
    parts = [_env_substituted(p.strip(), where) for p in spec.strip().split("::")]
    total = 0
    for p in parts:
        total += count_names(p, cap=MAX_SHARD_NAMES - total, where=where)
    try:
        import braceexpand
    except ImportError:
        raise DataError(f"{where}: shard patterns need webdataset: pip install 'vitlab[stream]'") from None
    urls = [u.strip() for p in parts for u in braceexpand.braceexpand(p) if u.strip()]
    if not urls:
        raise DataError(f"{where}: names no shard")
    for u in urls:
        check_scheme(u, allow_pipe=allow_pipe, where=where)
    check_unique(urls, where=where)
    return urls


def check_scheme(url: str, *, allow_pipe: bool, where: str) -> None:
    """Refuse a ``pipe:`` URL unless ``allow_pipe``, and any scheme outside :data:`URL_SCHEMES`."""
    scheme = url_scheme(url)
    if scheme is None or scheme in URL_SCHEMES:
        return
    if scheme == "pipe":
        if allow_pipe:
            return
        raise DataError(
            f"{where}: a pipe: URL runs a shell command; vitlab runs one only when it is typed on the command "
            "line with --allow-pipe (a resumed run too: give the same --data and --allow-pipe again)"
        )
    raise DataError(
        f"{where}: {scheme}: is not a scheme vitlab reads shards from (a local path, or "
        f"{', '.join(s + ':' for s in sorted(URL_SCHEMES))})"
    )


def check_unique(urls: Sequence[str], *, where: str) -> None:
    """Refuse a shard named twice: the same URL, or the same local file by two spellings (``./a.tar`` and
    ``a.tar``, a link, a brace pattern overlapping a ``::`` list), which would be read twice an epoch."""
    seen: dict[object, str] = {}
    for u in urls:
        key: object = u
        if url_scheme(u) in (None, "file"):
            try:
                st = os.stat(u.removeprefix("file:"))
                key = (st.st_dev, st.st_ino)
            except OSError:
                key = os.path.realpath(u.removeprefix("file:"))
        if key in seen:
            first = seen[key]
            again = "" if first == u else f" (as {quoted(first, 80)} and {quoted(u, 80)})"
            raise DataError(f"{where}: shard {quoted(u, 80)} is listed twice{again}; list each shard once")
        seen[key] = u

"""The data check's findings in ``report.html``: the groups of copies (leaks, conflicting labels, duplicates), tiny
and strip-shaped pictures as rows of small thumbnails, from the run's ``data_check.json`` and the data folder it
names; files that cannot be used and small classes as text.

``data_check.json`` is read as data: a regular file of at most :data:`MAX_REPORT_BYTES`, its paths taken only where
they stay inside the folder it names (relative, no ``..``); a picture that is gone or no longer decodes is shown by
its path alone. Thumbnails are JPEGs of at most :data:`THUMB_PX` pixels a side, for at most :data:`MAX_GROUPS` groups
of each kind and :data:`MAX_PER_GROUP` pictures of each, so the page stays small."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = ["MAX_GROUPS", "MAX_PER_GROUP", "THUMB_PX", "Gallery", "data_check_gallery"]

MAX_REPORT_BYTES = 64 << 20
THUMB_PX = 96
MAX_GROUPS = 8
MAX_PER_GROUP = 4
_SHOWN_KINDS = ("leak", "conflict", "duplicate", "tiny", "extreme_aspect")
_TITLES = {
    "leak": "evaluation images also in training",
    "conflict": "the same picture under two or more classes",
    "duplicate": "copies within one class",
    "tiny": "tiny images",
    "extreme_aspect": "strip-shaped images",
}

Gallery = list[tuple[str, list[tuple[str, bytes | None]]]]
"""Rows of a report section: ``(caption, [(label, JPEG bytes or None), ...])``."""


def _read_report(path: Path) -> dict[str, Any] | None:
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_REPORT_BYTES:
            return None
        with open(path, "rb") as f:
            doc = json.loads(f.read(MAX_REPORT_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    ok = isinstance(doc, dict) and isinstance(doc.get("findings"), list) and isinstance(doc.get("root"), str)
    return doc if ok else None


def _inside(root: Path, rel: object) -> Path | None:
    """``root / rel`` when ``rel`` is a relative path that stays inside ``root`` (no ``..``), else None."""
    if not isinstance(rel, str) or not rel:
        return None
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts:
        return None
    return root.joinpath(*p.parts)


def _thumb(path: Path | None) -> bytes | None:
    """A JPEG of at most :data:`THUMB_PX` a side of the picture at ``path`` (the one decoder), or None."""
    if path is None:
        return None
    from PIL import Image

    from ..data.images.decode import decode_image

    try:
        pixels = decode_image(path, shorter_side=THUMB_PX)
    except Exception:  # gone, changed, unreadable: the path alone
        return None
    im = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)
    im.thumbnail((THUMB_PX, THUMB_PX))
    buf = io.BytesIO()
    im.convert("RGB").save(buf, "JPEG", quality=80)
    return buf.getvalue()


def _caption(f: dict[str, Any]) -> str:
    kind = f.get("kind")
    if kind in ("tiny", "extreme_aspect") and isinstance(f.get("size"), list) and len(f["size"]) == 2:
        return f"{kind}: {f['size'][0]}x{f['size'][1]}"
    if kind == "conflict" and isinstance(f.get("classes"), list):
        return f"conflict ({f.get('match', '')}): classes {', '.join(map(str, f['classes']))}"
    return f"{kind} ({f.get('match', '')})"


def data_check_gallery(run: Path) -> tuple[str, Gallery, dict[str, Any]] | None:
    """``(text, rows of thumbnails, table)`` for the run folder's ``data_check.json``, or None when it has none."""
    doc = _read_report(run / "data_check.json")
    if doc is None:
        return None
    root = Path(doc["root"])
    findings = [f for f in doc["findings"] if isinstance(f, dict) and isinstance(f.get("paths"), list)]
    counts = doc.get("counts") if isinstance(doc.get("counts"), dict) else {}
    table = {k: v for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool)}
    rows: Gallery = []
    for kind in _SHOWN_KINDS:
        for f in [f for f in findings if f.get("kind") == kind][:MAX_GROUPS]:
            pics = [(str(p), _thumb(_inside(root, p))) for p in f["paths"][:MAX_PER_GROUP]]
            rows.append((f"{_TITLES[kind]}: {_caption(f)}", pics))
    unreadable = [f for f in findings if f.get("kind") == "unreadable"]
    small = [f for f in findings if f.get("kind") == "imbalance"]
    notes = []
    if unreadable:
        listed = "; ".join(f"{f['paths'][0]}: {f.get('reason', '')}" for f in unreadable[:MAX_GROUPS] if f["paths"])
        notes.append(f"Files that cannot be used: {listed}{' ...' if len(unreadable) > MAX_GROUPS else ''}.")
    for f in small:
        c = f.get("counts") if isinstance(f.get("counts"), dict) else {}
        notes.append(f"Small classes in {f.get('split', '?')}: {', '.join(f'{k} {v}' for k, v in c.items())}.")
    text = (
        f"What vitlab's data check found in {root} before the run (the whole list: {run / 'data_check.json'}; "
        "docs/data_check.md says what each finding means and what to do). " + " ".join(notes)
    )
    return text, rows, table

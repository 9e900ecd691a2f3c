"""Which files an ImageFolder holds: one class per sub-folder, image files found by extension.

The walk cannot lie: each real folder is entered once (symlink loops are reported, never followed
twice), each real file is counted once (a second path to it is left out, so no file is in both
train and val), only regular files are kept (FIFOs and devices are reported without being
opened), and every name is reported readably whatever bytes it holds.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..._text import readable, shown
from ...errors import DataError
from .decode import IMAGE_EXTENSIONS, is_image_name, unread_format

__all__ = ["LABEL_FILE_ENDINGS", "labels_file_hint", "layout_hint", "readable", "scan_classes", "shown"]

LABEL_FILE_ENDINGS = (".csv", ".tsv", ".json", ".jsonl", ".parquet")
"""Endings of the files other tools take labels from (a Kaggle ``train.csv``, Hugging Face's ``metadata.jsonl``):
vitlab reads none of them, a class is the folder an image is in; a folder that holds one is told so."""
_HINT_ENTRIES = 10_000  # entries of a folder's top a hint looks at, at most: a hint never walks a huge tree


@dataclass
class _Walk:
    """What one scan has seen: real folders and files by ``(st_dev, st_ino)`` with the path they were
    first reached by, ``problems``, ``(path, reason)`` of everything left out, and ``repeats``, ``(path, first path)``
    of the image files among them reached before by another path (links)."""

    dirs: dict[tuple[int, int], str] = field(default_factory=dict)
    files: dict[tuple[int, int], str] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)
    repeats: list[tuple[str, str]] = field(default_factory=list)

    def first_visit(self, path: str, st: os.stat_result, table: dict[tuple[int, int], str]) -> bool:
        key = (st.st_dev, st.st_ino)
        if key in table:
            return False
        table[key] = path
        return True


def _class_files(top: str, walk: _Walk) -> list[str]:
    """Image files under the class folder ``top``, in the order ``os.walk`` gives (each folder's files
    sorted, then its sub-folders sorted, depth first).

    Symbolic links are followed, but each real folder is entered once: a link back to a folder already
    scanned (``loop -> .``) would otherwise count its files again at every level, put copies of one
    file in both train and val, and never end with two loops; it is reported once and skipped. A real
    file reached twice (links) is counted once. Only regular files are kept, judged by ``stat`` of the
    link's target without opening it: opening a FIFO blocks until a writer comes, a device never ends."""
    from .decode import file_kind

    files: list[str] = []
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            walk.problems.append((d, f"cannot list this folder ({e.strerror or e})"))
            continue
        subdirs = []
        for e in entries:
            try:
                st = e.stat()  # follows links
            except OSError as err:
                why = "a broken symbolic link" if e.is_symlink() else f"cannot stat ({err.strerror or err})"
                if is_image_name(e.name) or not e.is_symlink():
                    walk.problems.append((e.path, why))
                continue
            if stat.S_ISDIR(st.st_mode):
                if walk.first_visit(e.path, st, walk.dirs):
                    subdirs.append(e.path)
                else:
                    first = walk.dirs[(st.st_dev, st.st_ino)]
                    walk.problems.append(
                        (e.path, f"a link to the folder {first}, already scanned: not followed again (a link loop)")
                    )
            elif is_image_name(e.name):
                if not stat.S_ISREG(st.st_mode):
                    walk.problems.append((e.path, f"not a regular file ({file_kind(st.st_mode)}); not opened"))
                elif walk.first_visit(e.path, st, walk.files):
                    files.append(e.path)
                else:
                    first = walk.files[(st.st_dev, st.st_ino)]
                    walk.problems.append((e.path, f"the same file as {first}; counted once"))
                    walk.repeats.append((e.path, first))
            elif (why := unread_format(e.name)) and stat.S_ISREG(st.st_mode):
                walk.problems.append((e.path, why))
        stack.extend(reversed(subdirs))
    return files


def scan_classes(
    root: Path,
    class_names: list[str] | None = None,
    *,
    min_classes: int = 1,
    seen: dict[tuple[int, int], str] | None = None,
    problems: list[tuple[str, str]] | None = None,
) -> tuple[list[str], np.ndarray, list[str]]:
    """Files of an ImageFolder tree ``root/<class>/**``, sorted; classes in sorted order. The
    ``(path, reason)`` of what the walk left out (:func:`_class_files`) are appended to ``problems``.
    Given ``class_names`` (the training classes), a class folder of ``root`` outside them is an error;
    otherwise fewer than ``min_classes`` class folders is. ``seen``: files already taken, by
    ``(st_dev, st_ino)`` (updated in place): reached again here, they are left out and reported."""
    own_classes = class_names is None
    try:
        found = {
            readable(e.name): e.path
            for e in os.scandir(root)
            if not e.name.startswith(".") and e.is_dir()  # is_dir follows links
        }
    except OSError as e:
        raise DataError(f"{root}: cannot list the class folders ({e.strerror or e})") from None
    if class_names is not None and set(found) - set(class_names):
        extra = sorted(set(found) - set(class_names))
        raise DataError(
            f"{root}: class folder(s) not in the training classes: {', '.join(extra[:10])}; "
            "the model cannot predict them (move them to train/ as well, or remove them)"
        )
    if class_names is None:
        class_names = sorted(found)
    if not class_names:
        raise DataError(f"{root}: no class folders (expected {root}/<class>/<image files>){layout_hint(root)}")
    if own_classes and len(class_names) < min_classes:
        raise DataError(
            f"{root}: only one class ({class_names[0]!r}) found; a classifier needs at least two "
            f"(add a folder per class, or pass --allow-single-class to train on it anyway){layout_hint(root)}"
        )
    walk = _Walk(files=seen if seen is not None else {})
    for d in [root, *(found[c] for c in class_names if c in found)]:  # a link back to any of them is a loop
        walk.first_visit(str(d), os.stat(d), walk.dirs)
    paths, labels = [], []
    for i, c in enumerate(class_names):
        if c not in found:
            continue
        for f in _class_files(found[c], walk):
            paths.append(f)
            labels.append(i)
    if problems is not None:
        problems.extend((readable(p), why) for p, why in walk.problems)
    if not paths:
        raise DataError(f"{root}: no image files ({', '.join(IMAGE_EXTENSIONS[:4])} ...) in the class folders")
    if own_classes:
        present = set(labels)
        empty = [c for i, c in enumerate(class_names) if i not in present]
        if empty:  # a class the model must output but can never learn: refuse, as torchvision's ImageFolder does
            for c in empty:
                if linked := _linked_away(found[c], walk):
                    raise DataError(
                        f"{root}: class folder {readable(c)}: each of its {linked[0]:,} image file(s) is the same file "
                        f"as one under another class folder ({linked[1]}: hard or symbolic links), and a file is "
                        "counted once, under the folder scanned first; a picture has one class: remove the copy "
                        "that is not in its class"
                    )
            raise DataError(
                f"{root}: class folder(s) without image files: {', '.join(empty[:10])}; "
                "add images or remove the folder(s)"
            )
    return paths, np.asarray(labels, dtype=np.int64), class_names


def _linked_away(folder: str, walk: _Walk) -> tuple[int, str] | None:
    """``(how many, the first as "path = first path")`` of the image files under ``folder`` that were reached
    before by another path (hard or symbolic links: ``walk.repeats``), or None when there are none: a class folder
    that comes out empty that way is not "without image files"."""
    inside = folder.rstrip(os.sep) + os.sep
    same = [(p, first) for p, first in walk.repeats if p.startswith(inside)]
    if not same:
        return None
    path, first = same[0]
    return len(same), f"{readable(path)} = {readable(first)}"


def layout_hint(root: str | os.PathLike[str]) -> str:
    """What the top of ``root`` shows of another layout, for the one-line error of a folder without two class
    folders (``"; ..."``, or ``""``): image files lying in it directly (each wants a folder named for its class), a
    labels file (``train.csv``, ``metadata.jsonl``: not read, docs/training.md says how to make class folders of
    it). Looks at the first :data:`_HINT_ENTRIES` entries of ``root`` alone, never deeper."""
    images, labels, more = 0, [], ""
    try:
        with os.scandir(root) as it:
            for i, e in enumerate(it):
                if i >= _HINT_ENTRIES:
                    more = "+"
                    break
                if e.name.startswith(".") or not e.is_file():
                    continue
                images += is_image_name(e.name)
                if e.name.lower().endswith(LABEL_FILE_ENDINGS):
                    labels.append(readable(e.name))
    except OSError:
        return ""
    hint = ""
    if images:
        hint += (
            f"; {images:,}{more} image file(s) lie in it directly, where they have no "
            "class: a class is the folder an image is in"
        )
    if labels:
        hint += f"; {', '.join(sorted(labels)[:3])} is not read (labels come from folder names): {_MAKE_FOLDERS}"
    return hint


_MAKE_FOLDERS = 'make a folder per class from it (docs/training.md, "Labels in a file")'


def labels_file_hint(path: str | os.PathLike[str]) -> str:
    """For a file given where a folder of images is read: ``". A labels file ..."`` when ``path`` ends as one
    (:data:`LABEL_FILE_ENDINGS`), else ``""``."""
    if not os.fspath(path).lower().endswith(LABEL_FILE_ENDINGS):
        return ""
    return f". A labels file is not read, a class is the folder an image is in: {_MAKE_FOLDERS}"

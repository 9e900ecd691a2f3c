"""Image files a user names on the command line (``vitlab predict``, ``inspect``, the deploy tools): the files as
given and the images in folders, each read with the one decoder (:func:`~vitlab.data.images.decode.decode_image`), a
file that cannot be used a one-line :class:`~vitlab.errors.InputError` naming it."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...errors import InputError
from .decode import IMAGE_EXTENSIONS, decode_image, is_image_name, unread_format

__all__ = ["image_files", "read_image"]


def image_files(
    paths: Sequence[str | os.PathLike[str]], *, left_out: list[tuple[Path, str]] | None = None
) -> list[Path]:
    """The image files the user named: files as given, folders searched recursively for
    :func:`is_image_name` files (sorted). A missing path, or a folder without images, is a one-line
    :class:`~vitlab.errors.InputError`; whether each file decodes is left to :func:`read_image`. Photos of a format
    the decoder does not read (:func:`~vitlab.data.images.decode.unread_format`: HEIC, raw ...) found in a folder
    are appended to ``left_out`` with the reason, and named by the error of a folder that holds nothing else."""
    files: list[Path] = []
    for p in (q for raw in paths for q in _expanded(os.fspath(raw))):
        if p.is_dir():
            found, unread = [], []
            for f in sorted(p.rglob("*")):
                if is_image_name(f.name) and f.is_file():
                    found.append(f)
                elif (why := unread_format(f.name)) and f.is_file():
                    unread.append((f, why))
            if left_out is not None:
                left_out += unread
            if not found:
                also = f"; {len(unread)} photo(s) of a format it cannot read ({unread[0][1]})" if unread else ""
                raise InputError(f"{p}: no image files ({', '.join(IMAGE_EXTENSIONS[:4])} ...) in this folder{also}")
            files.extend(found)
        elif p.exists():
            files.append(p)
        else:
            raise InputError(f"{p}: no such file or folder")
    return files


def _expanded(text: str) -> list[Path]:
    """The paths one command-line argument names: itself when it exists (a file named ``a[1].jpg`` too), else the
    paths a pattern (``*``, ``?``, ``[``) matches, sorted, as the shell expands them unquoted (Windows' shells do
    not); a URL, standard input (``-``) and a pattern that matches nothing are one-line errors."""
    p = Path(text)
    if p.exists():
        return [p]
    if "://" in text:
        raise InputError(f"{text}: a URL; vitlab reads image files: download it first (e.g. curl -O URL)")
    if text == "-":
        raise InputError("-: standard input is not read; give image files or folders")
    if any(c in text for c in "*?["):
        found = sorted(glob.glob(os.path.expanduser(text), recursive=True))
        if not found:
            raise InputError(f"{text}: no file or folder matches this pattern")
        return [Path(f) for f in found]
    return [p]


def read_image(path: str | os.PathLike[str], *, max_pixels: int | None = None) -> np.ndarray:
    """A user-named image file as an RGB ``(H, W, 3)`` uint8 array (:func:`decode_image`); a file
    that cannot be used raises a one-line :class:`~vitlab.errors.InputError` naming it and why."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    try:
        return decode_image(path, max_pixels=max_pixels)
    except Exception as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise InputError(f"{path}: not a readable image ({type(e).__name__}{': ' + why if why else ''})") from None

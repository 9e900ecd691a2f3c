"""File-system helpers shared by the data cache and the training checkpoints."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["remove_stale", "writer_suffix"]


def writer_suffix() -> str:
    """``<pid>-<random hex>``: a temp-file suffix no other writer shares, even one with the same pid
    on another host of a shared file system; :func:`remove_stale` reads the pid back from it."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def remove_stale(folder: Path, prefix: str) -> None:
    """Delete ``folder/<prefix><pid>`` (or ``<prefix><pid>-<suffix>``) files left by writers that
    were killed mid-write.

    A file is removed only when its process is gone; our own and those of live
    processes (even of other users) are left alone.
    """
    for tmp in folder.glob(f"{prefix}*"):
        pid = tmp.name[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except OSError:  # alive under another user, or no permission to ask
            pass

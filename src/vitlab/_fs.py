"""File-system helpers shared by the data cache and the training checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["remove_stale"]


def remove_stale(folder: Path, prefix: str) -> None:
    """Delete ``folder/<prefix><pid>`` files left by writers that were killed mid-write.

    A file is removed only when its process is gone; our own and those of live
    processes (even of other users) are left alone.
    """
    for tmp in folder.glob(f"{prefix}*"):
        pid = tmp.name[len(prefix) :]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except OSError:  # alive under another user, or no permission to ask
            pass

"""File-system helpers shared by the data cache, the training run folder and the model writers:
temporary names unique to each writer, the clean-up of those left by killed writers, and the
lock that keeps two runs out of one folder."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import VitlabError

__all__ = [
    "FolderLock",
    "FolderLockedError",
    "atomic_write_text",
    "default_file_mode",
    "fsync_dir",
    "remove_stale",
    "removed_if_unused",
    "temp_path",
    "writer_suffix",
    "writes_onto",
]


def writer_suffix() -> str:
    """``<pid>-<random hex>``: a temp-file suffix no other writer shares. The pid lets
    :func:`remove_stale` delete the file once its writer is gone; the random part keeps two writers
    of one process (threads, or a pid reused in a container or on another host) apart."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def temp_path(path: Path) -> Path:
    """A temporary name beside ``path`` that no other writer uses: ``.<name>.tmp<pid>-<random>``."""
    return path.with_name(f".{path.name}.tmp{writer_suffix()}")


def default_file_mode() -> int:
    """The mode ``open()`` gives a new file: ``0o666`` less the process umask (``0o644`` under umask
    022). Writers that create files with a private mode (safetensors, ``mkstemp``: ``0o600``) apply it
    before renaming into place, so a saved model is as readable as the ``config.json`` beside it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: read it by setting it (and put it back at once)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def removed_if_unused(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """Run a command that writes into ``folder``; if it fails, remove the folders it created and
    left empty (``folder`` and the missing parents made for it), so a failed command leaves no
    empty ``runs/<timestamp>`` behind. Folders that existed before, or hold anything, are kept."""
    path = Path(folder)
    made = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    try:
        yield path
    except BaseException:
        for p in made:
            try:
                p.rmdir()  # only when empty
            except OSError:
                break
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a :func:`temp_path` and rename it over ``path``: readers see the old file or
    the new one, never half of one. The temporary file is removed if the write fails, and those of
    writers killed mid-write are removed first."""
    remove_stale(path.parent, f".{path.name}.tmp")
    tmp = temp_path(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (the folder's entry, not only the file's data)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # some file systems cannot fsync a directory
        pass


def remove_stale(folder: Path, prefix: str) -> None:
    """Delete ``folder/<prefix><pid>[-...]`` files left by writers that were killed mid-write.

    A file is removed only when its process is gone; our own and those of live
    processes (even of other users) are left alone.
    """
    for tmp in folder.glob(f"{prefix}*"):
        m = re.match(r"(\d+)(?:$|[-.])", tmp.name[len(prefix) :])
        if not m or int(m.group(1)) == os.getpid():
            continue
        if not _alive(int(m.group(1))):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive under another user, or no permission to ask
        return True
    return True


def writes_onto(targets: list[Path], source: str | os.PathLike[str]) -> Path | None:
    """The first of ``targets`` that already exists and is ``source`` itself or a file inside the
    folder ``source``: writing it would destroy the input being read. None when ``source`` is no
    path (a model name) or nothing collides."""
    src = Path(source)
    if not src.exists():
        return None
    src = src.resolve()
    for t in targets:
        if t.exists() and (t.resolve() == src or (src.is_dir() and src in t.resolve().parents)):
            return t
    return None


class FolderLockedError(VitlabError):
    """Another live process holds the folder's lock."""


class FolderLock:
    """``folder/.lock`` held while one process writes ``folder``: the file names its owner (pid and
    host) and is ``flock``-ed for as long as the owner lives, so the kernel releases it when the
    owner dies however it dies. A second writer is refused with the owner's name. A lock file left
    by a dead owner (its ``flock`` gone) is taken over, with a message. On file systems without
    ``flock`` the owner's pid is checked instead (on this host; another host's lock is honoured).

    Use as a context manager; :meth:`release` deletes the file."""

    NAME = ".lock"

    def __init__(self, folder: str | os.PathLike[str], *, log: Callable[[str], None] | None = None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / self.NAME
        self.log = log or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
        self._fd: int | None = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        import fcntl

        self.folder.mkdir(parents=True, exist_ok=True)
        me = f"{os.getpid()} {socket.gethostname()}"
        for _ in range(10):  # the file may be replaced between open and flock: retry with the new one
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            owner = os.read(fd, 4096).decode("utf-8", "replace").split()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                checked = True
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise FolderLockedError(self._in_use(owner)) from None
                checked = False  # no flock on this file system: judge by the pid
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # released and deleted by its owner after we opened it
                os.close(fd)
                continue
            if len(owner) >= 2 and owner[0].isdigit():
                pid, host = int(owner[0]), owner[1]
                if not checked and (host != socket.gethostname() or (pid != os.getpid() and _alive(pid))):
                    os.close(fd)
                    raise FolderLockedError(self._in_use(owner))
                if pid != os.getpid() or host != socket.gethostname():
                    self.log(f"{self.path}: took over the lock left by pid {pid} on {host}, which is no longer running")
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{me}\n".encode(), 0)
            self._fd = fd
            return
        raise FolderLockedError(f"{self.folder}: cannot take the lock {self.path}; it keeps changing")

    def _in_use(self, owner: list[str]) -> str:
        who = f"pid {owner[0]} on {owner[1]}" if len(owner) >= 2 else "another process"
        return f"{self.folder} is in use by {who} (lock {self.path}); wait for that run to end, or use another --out"

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still holding it: a waiting opener sees the inode change
        finally:
            os.close(self._fd)
            self._fd = None

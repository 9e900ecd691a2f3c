"""File-system helpers shared by the data cache, the training run folder and the model writers:
temporary names unique to each writer, the clean-up of those left by killed writers, the lock that
keeps two runs out of one folder, the one way every output is written, and the one bounded read of a small
file vitlab is handed (:func:`read_small`).

Nothing is written through a link (git's rule for what it did not create). Every file vitlab writes goes
to a temporary name beside it and is renamed over its entry (:func:`replacing`): a symbolic link there is
replaced by the new file, never followed, and a reader never sees half a file. Every folder vitlab writes
into inside a run or export folder is made real first (:func:`own_folder`): a link there is replaced by an
empty folder, never written into. A write that fails (a full disk, a read-only folder, a folder where a
file goes) is one :class:`~vitlab.errors.OutputError` line, and leaves no partial file behind."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import socket
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import OutputError, VitlabError

__all__ = [
    "FolderLock",
    "FolderLockedError",
    "NotAFile",
    "TooLarge",
    "append_text",
    "atomic_write_bytes",
    "atomic_write_text",
    "default_file_mode",
    "fsync_dir",
    "open_append",
    "output_error",
    "own_folder",
    "read_small",
    "refuse_folder",
    "remove_stale",
    "removed_if_unused",
    "replacing",
    "staging",
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


def output_error(path: Path, e: OSError, *, what: str = "it", kept: str | None = None) -> OutputError:
    """The one line for a write of ``path`` that failed with ``e``: the path, the system's reason and what is
    left (``kept``: by default, whether an earlier file of that name is kept)."""
    why = e.strerror or str(e) or type(e).__name__
    blocker = _file_in_the_way(path, itself=True) if e.errno in (errno.ENOTDIR, errno.EEXIST) else None
    if blocker is not None:  # the system's "Not a directory" / "File exists": which file is in the way
        why = "a file of that name is there" if blocker == path else f"{blocker} is a file, not a folder"
    if kept is None:
        kept = f"the previous {path.name} is kept" if path.is_file() else "nothing was written"
    err = OutputError(f"{path}: cannot write {what} ({why}); {kept}")
    err.errno, err.strerror = e.errno, e.strerror
    return err


def refuse_folder(path: Path) -> None:
    """A one-line :class:`~vitlab.errors.OutputError` when ``path``, where vitlab writes a file, is a real folder
    (a link is fine: it is replaced)."""
    if path.is_dir() and not path.is_symlink():
        raise OutputError(
            f"{path}: is a folder, where vitlab writes a file of that name; move it away or write elsewhere"
        )


def refuse_blocked(path: Path, *, what: str = "it") -> None:
    """A one-line :class:`~vitlab.errors.OutputError` when something stands where the file ``path`` is to be
    written: a real folder of its name (:func:`refuse_folder`), or a file where one of the folders it goes into
    would be (``vitlab convert m/ notes.txt/x.npz``: the system would say "Not a directory" or "File exists")."""
    refuse_folder(path)
    parent = _file_in_the_way(path, itself=False)
    if parent is not None:
        raise OutputError(
            f"{parent}: is a file, where vitlab writes {what} into a folder of that name; move it away or write "
            "elsewhere"
        )


def _file_in_the_way(path: Path, *, itself: bool) -> Path | None:
    """The nearest existing entry of ``path``'s folders (and ``path`` itself, with ``itself``) when it is not a
    folder: what stands where vitlab would make or enter one; None when the nearest is a folder."""
    for p in (path, *path.parents) if itself else path.parents:
        if os.path.lexists(p):
            return None if p.is_dir() else p
    return None


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, durable: bool = False, what: str = "it") -> Iterator[Path]:
    """Write the file ``path`` through a temporary name: yields :func:`temp_path` ``(path)`` for the caller
    (or a library: ``savefig``, ``save_file``, ``onnx``) to write, then renames it over ``path``. The rename
    replaces the entry itself: a symbolic link at ``path`` becomes the new file and what it pointed to is never
    touched; readers see the old file or the new one, never half of one. ``durable``: fsync the file and the
    folder (for checkpoints). On any failure the temporary file is removed and the previous ``path`` stays; a
    system error is one :class:`~vitlab.errors.OutputError` line (``what``: how it names the file). A real
    folder at ``path`` is refused before anything is written."""
    path = Path(path)
    refuse_folder(path)
    with contextlib.suppress(OSError):  # temporary files of writers killed mid-write
        remove_stale(path.parent, f".{path.name}.tmp")
    tmp = temp_path(path)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        _discard(tmp)
        if isinstance(e, OSError) and not isinstance(e, VitlabError):
            if isinstance(e, IsADirectoryError):
                refuse_folder(path)
            raise output_error(path, e, what=what) from None
        raise
    if durable:
        fsync_dir(path.parent)


def _discard(tmp: Path) -> None:
    """Remove a temporary file (or a folder a library made under its name)."""
    try:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
    except OSError:
        pass


def atomic_write_text(path: Path, text: str, *, what: str = "it") -> None:
    """Write ``text`` to ``path`` through :func:`replacing`: readers see the old file or the new one, never
    half of one; a link at ``path`` is replaced, never written through."""
    with replacing(path, what=what) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_bytes(path: Path, data: bytes, *, what: str = "it") -> None:
    """Write ``data`` to ``path`` through :func:`replacing` (see :func:`atomic_write_text`)."""
    with replacing(path, what=what) as tmp:
        tmp.write_bytes(data)


_COPY_LIMIT = 1 << 30
"""The most bytes copied from what a link pointed to when the link is made a file of its own (a log)."""


def open_append(path: str | os.PathLike[str], *, what: str = "it") -> Any:
    """``path`` opened to append text. A link there is first replaced by a file of its own holding a copy of
    the regular file it pointed to (at most :data:`_COPY_LIMIT` bytes; nothing from anything else), so the
    appended lines never reach the link's target; the file is then opened without following links."""
    p = Path(path)
    refuse_folder(p)
    if p.is_symlink():
        with replacing(p, what=what) as tmp, open(tmp, "wb") as dst:
            try:
                if os.path.isfile(p):  # (never opened otherwise: a FIFO would block)
                    with open(p, "rb") as src:
                        dst.write(src.read(_COPY_LIMIT))
            except OSError:
                pass  # a target that cannot be read: start anew
    try:
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o666)
        return os.fdopen(fd, "a", encoding="utf-8", newline="")
    except OSError as e:
        raise output_error(p, e, what=what, kept="the lines before are kept") from None


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def append_text(path: str | os.PathLike[str], text: str, *, durable: bool = True, what: str = "it") -> None:
    """Append ``text`` to ``path`` (:func:`open_append`: never through a link); ``durable``: fsync it."""
    f = open_append(path, what=what)
    try:
        with f:
            f.write(text)
            f.flush()
            if durable:
                os.fsync(f.fileno())
    except OSError as e:
        if isinstance(e, VitlabError):
            raise
        raise output_error(Path(path), e, what=what, kept="the lines before are kept") from None


def own_folder(
    path: str | os.PathLike[str], *, what: str = "its outputs", log: Callable[[str], None] | None = None
) -> Path:
    """The folder ``path`` inside a run or export folder, made real before anything is written into it:
    made when missing (with its parents); a symbolic link there (to a folder, a file or nothing) is removed
    and an empty folder made in its place, so that nothing is written into what it pointed to (``log`` says
    so); a file there is refused in one line (``what``: what vitlab writes in the folder)."""
    p = Path(path)
    try:
        if p.is_symlink():
            target = os.readlink(p)
            p.unlink()
            if log is not None:
                log(f"{p}: was a link to {target}; replaced by a folder of its own (nothing is written through it)")
        elif p.exists() and not p.is_dir():
            raise OutputError(f"{p}: is a file, where vitlab writes {what} (a folder); move it away or write elsewhere")
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if isinstance(e, VitlabError):
            raise
        raise output_error(p, e, what=what, kept="nothing was written") from None
    return p


@contextlib.contextmanager
def staging(folder: str | os.PathLike[str], *, what: str = "it", shown: Path | None = None) -> Iterator[Path]:
    """Write several files into ``folder`` at once: yields a new temporary folder beside them for the caller to
    fill with the files' final names (a writer that names one file after another: an ONNX graph and its
    ``.data``), then renames each over its entry in ``folder`` (a link there is replaced, never followed). On any
    failure the temporary folder is removed with what it holds; a system error is one
    :class:`~vitlab.errors.OutputError` line naming ``shown`` (by default ``folder``)."""
    folder = Path(folder)
    with contextlib.suppress(OSError):
        remove_stale(folder, ".vitlab-stage.tmp")
    stage = folder / f".vitlab-stage.tmp{writer_suffix()}"
    try:
        stage.mkdir()
        yield stage
        names = sorted(p.name for p in stage.iterdir())
        for n in names:
            refuse_folder(folder / n)
        for n in names:
            os.replace(stage / n, folder / n)
    except BaseException as e:
        if isinstance(e, OSError) and not isinstance(e, VitlabError):
            raise output_error(shown or folder, e, what=what) from None
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


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
            if tmp.is_dir() and not tmp.is_symlink():  # a staging folder (:func:`staging`)
                shutil.rmtree(tmp, ignore_errors=True)
            else:
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

        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise output_error(self.folder, e, what="the folder", kept="nothing was written") from None
        me = f"{os.getpid()} {socket.gethostname()}"
        for _ in range(10):  # the file may be replaced between open and flock: retry with the new one
            if self.path.is_symlink():  # not a lock vitlab made: the link goes, what it points to is never written
                self.path.unlink(missing_ok=True)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o644)
            except OSError as e:
                if e.errno == errno.ELOOP:  # a link made after the check: look again
                    continue
                raise output_error(self.path, e, what="the run folder's lock", kept="nothing was written") from None
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


class NotAFile(ValueError):
    """What :func:`read_small` was given is not a regular file (a folder, a device, a FIFO; a link where links are
    refused)."""


class TooLarge(ValueError):
    """What :func:`read_small` was given holds more than its bound: ``size`` bytes (at least)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size:,} bytes")
        self.size = size


def read_small(path: str | os.PathLike[str], *, limit: int, links: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them: the bound a small file (a config, a
    manifest, a settings or sizing file) honestly has, so that a file someone hands over is never read whole when it
    is not what it says. The checks are made on the open file (no race between a check and the read); ``links``:
    whether a symbolic link at ``path`` is followed (False: refused as :class:`NotAFile`). Raises
    :class:`FileNotFoundError` when there is none, :class:`NotAFile`, :class:`TooLarge`, or the :class:`OSError` of
    the read."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO does not block the open
    if not links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW on a link
            raise NotAFile(f"{path}: a link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAFile(f"{path}: not a regular file")
        if st.st_size > limit:
            raise TooLarge(st.st_size)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        data = f.read(limit + 1)
    if len(data) > limit:  # grew since the fstat
        raise TooLarge(len(data))
    return data

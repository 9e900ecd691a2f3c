"""Pack an ImageFolder into WebDataset-style tar shards with a manifest (``vitlab data pack``).

Each sample is two tar members that share a key, as WebDataset (and timm's ``reader_wds``) expect:
``<key>.<ext>``, the original encoded file byte for byte (nothing is re-encoded, so a reader can decode at full
resolution and random-crop the original picture), and ``<key>.cls``, the class index as decimal text. The key
is ``<source path>/<split><index>`` (the source file relative to the packed folder, e.g.
``train/cat/001.jpg/train000000042``), so an error about a sample at training time names the file it came from.
Shards are named ``<split>-000000.tar``; ``manifest.json`` (:mod:`vitlab.data.shards.manifest`) lists the class names
and, per shard, its samples, bytes, per-class counts and SHA-256, so a reader can check a shard and split
shards across ranks and workers by sample count without opening them.

What is packed is checked as it is packed: each file is decoded once (a 0-byte file, an HTML page named
``.jpg``, a truncated or undecodable image, a decompression bomb, a file over the member size a reader
accepts are left out and listed with their reason in ``OUT/bad_files.txt``, or refused with ``strict``), and a
symbolic link to a file outside the source folder is never followed. Each file is copied into its shard in
bounded chunks, and each shard's SHA-256 is computed from the bytes as they are written. A shard is written to a
temporary name and renamed when complete; the manifest is written last, so a folder with a manifest is
complete. A failed pack (a full disk, a file that changed while it was read) removes what it wrote and
nothing else.
Only the standard library's :mod:`tarfile` is used: the shards are plain POSIX (pax) tars that
``webdataset``, ``tar`` and :func:`read_shard` all read. Samples are shuffled (seeded) before packing,
so that a streaming reader's bounded shuffle buffer sees every class from its first shard.
This module writes and checks shards; :mod:`vitlab.data.shards.stream` trains and evaluates from them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .manifest import FORMAT, MANIFEST, MAX_MANIFEST_BYTES, VERSION, PackError, read_manifest
from .source import MAX_MEMBER_BYTES

__all__ = ["BAD_FILES", "MANIFEST", "PackError", "pack_folder", "read_manifest", "read_shard"]

BAD_FILES = "bad_files.txt"
"""``OUT/bad_files.txt``: ``<source path>\\t<reason>`` of each file ``vitlab data pack`` left out."""
_BUFFER = 256 << 10


@dataclass(frozen=True)
class _Sample:
    path: str
    label: int


def _splits(root: Path) -> dict[str, Path]:
    """The split folders of ``root`` as :func:`vitlab.data.load_data` finds them: ``train`` and the first
    of ``val``/``valid``/``validation``/``test``, or ``root`` itself as one ``train`` tree."""
    train = root / "train"
    val = next((root / n for n in ("val", "valid", "validation", "test") if (root / n).is_dir()), None)
    if train.is_dir():
        return {"train": train, **({val.name: val} if val is not None else {})}
    return {"train": root}


def _write_all(fd: int, data: memoryview) -> None:
    """``os.write`` until every byte is written (a full disk raises ``OSError(ENOSPC)`` here)."""
    while data:
        data = data[os.write(fd, data) :]


class _SourceChanged(Exception):
    """A source file could not be read to the size it had when it was checked."""


class _Source(io.RawIOBase):
    """A source file read in the chunks ``tarfile`` asks for; a short or failed read is :class:`_SourceChanged`."""

    def __init__(self, f: io.BufferedReader, path: str) -> None:
        self.f, self.path = f, path

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        try:
            data = self.f.read(n)
        except OSError as e:
            raise _SourceChanged(f"{self.path}: cannot be read ({e.strerror or e})") from None
        if n > 0 and len(data) < n:
            raise _SourceChanged(f"{self.path}: shrank while it was packed")
        return data


@dataclass
class _ShardWriter:
    """One shard being written to a temporary file: buffered, and hashed as it is written (the SHA-256 of the
    finished shard without reading it again); ``tar`` writes into it, ``counts`` are its samples per class and
    ``files`` the bytes of their files (what ``--shard-size`` bounds)."""

    path: Path
    name: str
    classes: int
    fd: int = -1
    written: int = 0
    files: int = 0
    sha: object = field(default_factory=hashlib.sha256)
    buf: bytearray = field(default_factory=bytearray)
    counts: list[int] = field(default_factory=list)
    tar: tarfile.TarFile | None = None

    def __post_init__(self) -> None:
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.counts = [0] * self.classes
        self.tar = tarfile.TarFile(fileobj=self, mode="w", format=tarfile.PAX_FORMAT)  # type: ignore[arg-type]

    def write(self, data: bytes) -> int:
        self.sha.update(data)  # type: ignore[attr-defined]
        self.buf += data
        self.written += len(data)
        if len(self.buf) >= _BUFFER:
            self.flush()
        return len(data)

    def tell(self) -> int:
        return self.written

    def flush(self) -> None:
        _write_all(self.fd, memoryview(self.buf))
        self.buf.clear()

    def add(self, key: str, ext: str, f: _Source, size: int, label: int) -> None:
        """One sample: its file (read in chunks) and its class index."""
        self.tar.addfile(_member(f"{key}.{ext}", size), f)  # type: ignore[union-attr]
        text = str(label).encode()
        self.tar.addfile(_member(f"{key}.cls", len(text)), io.BytesIO(text))  # type: ignore[union-attr]
        self.counts[label] += 1
        self.files += size

    def finish(self, wrote: list[Path]) -> dict[str, object]:
        """Complete the shard, rename it into place (added to ``wrote``) and return its manifest row."""
        self.tar.close()  # type: ignore[union-attr]
        self.flush()
        os.fsync(self.fd)
        self.close()
        final = self.path.with_name(self.name)
        os.replace(self.path, final)
        wrote.append(final)
        digest = self.sha.hexdigest()  # type: ignore[attr-defined]
        n = sum(self.counts)
        return {"name": self.name, "samples": n, "bytes": self.written, "sha256": digest, "class_counts": self.counts}

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = size, 0, 0o444, 0, 0
    return info


def _key_path(path: str, root: str) -> str:
    """The source file's path relative to the packed folder, as a tar name may hold it (printable text)."""
    from ..images.scan import readable

    rel = readable(os.path.relpath(path, root)).replace(os.sep, "/")
    return "".join(c if c.isprintable() else "?" for c in rel)


def _check_out(dest: Path, root: Path, *, overwrite: bool) -> list[str]:
    """Refuse an ``OUT`` that is a file, lies inside ``SRC``, or already holds shards (unless ``overwrite``);
    the shard names the previous manifest listed (to report the ones this pack does not write again)."""
    if dest.exists() and not dest.is_dir():
        raise PackError(f"{dest}: exists and is not a folder; choose another OUT")
    real = Path(os.path.realpath(dest))
    if real == root or root in real.parents:
        raise PackError(f"{dest}: inside the folder being packed ({root}); choose an OUT outside it")
    if not dest.is_dir():
        return []
    has_manifest = (dest / MANIFEST).exists()
    tars = sorted(p.name for p in dest.glob("*.tar"))
    if not (has_manifest or tars) or not overwrite:
        if has_manifest or tars:
            held = MANIFEST if has_manifest else f"{len(tars)} .tar file(s)"
            raise PackError(
                f"{dest}: already holds packed shards ({held}); choose another OUT, or pass --overwrite to replace them"
            )
        return []
    old: list[str] = []
    try:
        old = [sh["name"] for s in read_manifest(dest)["splits"].values() for sh in s["shards"]]
    except PackError as e:  # a damaged pack of vitlab's is replaced; another program's manifest is never removed
        if has_manifest and not _our_manifest(dest / MANIFEST):
            raise PackError(
                f"{dest}: its {MANIFEST} is not one vitlab wrote ({str(e).removeprefix(f'{dest / MANIFEST}: ')}); "
                "--overwrite replaces only a pack's own files: move it away, or choose another OUT"
            ) from None
    (dest / MANIFEST).unlink(missing_ok=True)  # replaced at the end; until then the folder is not complete
    return old


def _our_manifest(path: Path) -> bool:
    """Whether ``path`` is a manifest vitlab wrote (its ``format``), however damaged its pack is."""
    import json

    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(MAX_MANIFEST_BYTES + 1))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def _text(s: str) -> str:
    """A path or a reason as one line of text (bytes that are not UTF-8 and control characters escaped)."""
    from ..images.scan import readable
    from .names import quoted

    return quoted(readable(s), limit=4096)


def _shown(path: str, why: str) -> str:
    return f"{_text(path)}: cannot be packed ({_text(why)})"


def _checked(path: str, root: str, *, max_pixels: int | None, max_member: int) -> str:
    """Why ``path`` cannot be packed, or "" (it decodes, is inside ``root`` and within the size limit)."""
    from ..images.decode import decode_image

    real = os.path.realpath(path)
    if os.path.commonpath([real, root]) != root:
        return f"a symbolic link to {real}, outside the folder being packed: not followed"
    try:
        size = os.stat(real).st_size
        if size > max_member:
            return f"{size:,} bytes, over the {max_member:,} bytes a shard reader reads for one image"
        decode_image(real, size=16, max_pixels=max_pixels)
    except Exception as e:  # any file that cannot be used is reported, never fatal here
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return ""


def pack_folder(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    shard_bytes: int = 1 << 30,
    seed: int = 0,
    progress: bool = True,
    strict: bool = False,
    overwrite: bool = False,
    max_pixels: int | None = None,
    max_member: int = MAX_MEMBER_BYTES,
    log: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """Write ``src`` (an ImageFolder: ``train/<class>/*`` with ``val/``, or one class tree) as tar shards
    of at most ``shard_bytes`` of files (at least one sample a shard) plus ``manifest.json`` under
    ``out``, and return the manifest.

    Files that cannot be used (see the module's notes; ``max_pixels`` is the decompression-bomb guard, default
    PIL's) are left out, listed in ``out/bad_files.txt`` and counted in the manifest's ``skipped``; with
    ``strict`` the first one is a :class:`PackError` instead. An ``out`` that already holds shards or a manifest
    is refused unless ``overwrite``, which replaces them (files of the previous pack that this one does not
    write again are named through ``log``, never deleted). A failure removes what this call wrote."""
    from ..._progress import ProgressLog
    from ..images.scan import scan_classes

    root, dest = Path(src).expanduser(), Path(out)
    if not root.is_dir():
        raise PackError(f"{src}: not a folder (vitlab data pack reads an ImageFolder)")
    if shard_bytes < 1:
        raise PackError("--shard-size must be positive")
    root_real = os.path.realpath(root)
    old = _check_out(dest, Path(root_real), overwrite=overwrite)
    made = [p for p in (dest, *dest.parents) if not p.exists()]
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from ..._fs import output_error

        raise output_error(dest, e, what="the shards", kept="nothing was written") from None
    wrote: list[Path] = []
    writer: _ShardWriter | None = None
    try:
        classes: list[str] | None = None
        seen: dict[tuple[int, int], str] = {}
        skipped: list[tuple[str, str]] = []
        manifest: dict[str, object] = {"format": FORMAT, "version": VERSION, "source": root_real}
        splits: dict[str, object] = {}
        for split, folder in _splits(root).items():
            paths, labels, names = scan_classes(folder, classes, seen=seen, problems=skipped)
            if strict and skipped:
                raise PackError(f"{_shown(*skipped[0])} (--strict-data)")
            classes = classes or names
            order = np.random.default_rng(seed).permutation(len(paths))
            samples = [_Sample(paths[i], int(labels[i])) for i in order]
            shards: list[dict[str, object]] = []
            with ProgressLog(total=len(samples), desc=f"packing {split}", unit="img", enabled=progress) as bar:
                for i, smp in enumerate(samples):
                    bar.update(1)
                    why = _checked(smp.path, root_real, max_pixels=max_pixels, max_member=max_member)
                    with contextlib.ExitStack() as held:
                        try:
                            f = None if why else held.enter_context(open(os.path.realpath(smp.path), "rb", 0))
                        except OSError as e:
                            f, why = None, f"cannot be read ({e.strerror or e})"
                        if f is None:
                            if strict:
                                raise PackError(
                                    f"{_shown(smp.path, why)}; fix or remove it, or drop --strict-data "
                                    f"to leave such files out (listed in {dest / BAD_FILES})"
                                )
                            skipped.append((smp.path, why))
                            continue
                        size = os.fstat(f.fileno()).st_size
                        if writer is not None and writer.files + size > shard_bytes:
                            shards.append(writer.finish(wrote))
                            writer = None
                        if writer is None:
                            name = f"{split}-{len(shards):06d}.tar"
                            writer = _ShardWriter(path=_temp(dest / name), name=name, classes=len(classes))
                        key = f"{_key_path(smp.path, str(root))}/{split}{i:09d}"
                        ext = Path(smp.path).suffix.lower().lstrip(".") or "img"
                        writer.add(key, ext, _Source(f, smp.path), size, smp.label)
                if writer is not None:
                    shards.append(writer.finish(wrote))
            writer = None
            if not shards:
                first = f" (e.g. {_shown(*skipped[-1])})" if skipped else ""
                raise PackError(f"{folder}: none of its {len(samples)} image file(s) can be packed{first}")
            splits[split] = {"samples": sum(sh["samples"] for sh in shards), "shards": shards}  # type: ignore[misc]
        manifest.update(classes=classes, splits=splits, skipped=len(skipped))
        _finish(dest, manifest, skipped)
    except BaseException as e:
        if writer is not None:
            writer.close()
            writer.path.unlink(missing_ok=True)
        for p in wrote:
            p.unlink(missing_ok=True)
        for p in made:
            try:
                p.rmdir()
            except OSError:
                break
        if isinstance(e, _SourceChanged):
            raise PackError(f"{e}; nothing was packed (run it again)") from None
        if isinstance(e, OSError):
            raise PackError(f"{dest}: cannot write the shards ({e.strerror or e}); nothing was kept") from None
        raise
    _report(dest, skipped, [n for n in old if n not in _names(manifest) and (dest / n).exists()], log)
    return manifest


def _temp(path: Path) -> Path:
    from ..._fs import remove_stale, temp_path

    remove_stale(path.parent, f".{path.name}.tmp")  # left by a killed pack
    return temp_path(path)


def _finish(dest: Path, manifest: dict[str, object], skipped: list[tuple[str, str]]) -> None:
    """``bad_files.txt`` (when something was left out, or to replace a previous one), then the manifest."""
    import json

    from ..._fs import atomic_write_text, fsync_dir

    if skipped or (dest / BAD_FILES).exists():
        rows = (f"{_text(p)}\t{_text(why)}\n" for p, why in skipped)
        atomic_write_text(dest / BAD_FILES, "".join(rows))
    atomic_write_text(dest / MANIFEST, json.dumps(manifest, indent=1))
    fsync_dir(dest)


def _names(manifest: dict[str, object]) -> set[str]:
    return {sh["name"] for s in manifest["splits"].values() for sh in s["shards"]}  # type: ignore[union-attr]


def _report(dest: Path, skipped: list[tuple[str, str]], stale: list[str], log: Callable[[str], None] | None) -> None:
    if log is None:
        return
    if skipped:
        log(f"warning: left out {len(skipped)} file(s) that cannot be packed; list in {dest / BAD_FILES}")
    if stale:
        log(
            f"warning: {len(stale)} shard(s) of the previous pack are no longer listed and were left in place "
            f"(e.g. {dest / stale[0]}); delete them if you do not need them"
        )


def read_shard(path: str | os.PathLike[str]) -> Iterator[tuple[str, bytes, int]]:
    """``(key, encoded image bytes, class index)`` of each sample of one shard, in order."""
    with tarfile.open(path, "r") as tar:
        image: tuple[str, bytes] | None = None
        for member in tar:
            key, _, ext = member.name.rpartition(".")
            f = tar.extractfile(member)
            data = f.read() if f is not None else b""
            if ext == "cls":
                if image is None or image[0] != key:
                    raise PackError(f"{path}: {member.name} without its image")
                yield key, image[1], int(data)
                image = None
            else:
                image = (key, data)

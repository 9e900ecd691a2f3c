"""Reading a sharded checkpoint (:mod:`vitlab.train.persist.dcp`) without unpickling what its files say.

``torch.distributed.checkpoint`` (DCP) stores a folder's table of contents, ``.metadata``, as a
pickle and reads it with ``pickle.load``; the values of its non-tensor items (the optimizer's
hyper-parameters) are pickles inside the ``.distcp`` shards, read with ``torch.load(weights_only=False)``.
Either would run the code a crafted file names. Here both are read the way ``torch.load(weights_only=True)``
reads ``last.pt``:

- ``.metadata`` through a restricted unpickler (:func:`read_metadata`) that builds only the classes
  DCP's metadata is made of (:data:`ALLOWED`) and refuses any other global by name before it is
  called; then every entry is checked (types, chunks inside and covering their tensor, each stored
  piece inside a ``__<rank>_<n>.distcp`` file of the folder, no storage transforms);
- non-tensor items with ``torch.load(weights_only=True)`` (:class:`SafeLoadPlanner`), and each must
  have the type of the value it replaces; tensors DCP already reads with ``weights_only=True``;
- each item only if it unpacks to no more than the bytes it occupies (:class:`SafeReader`): torch's zip
  reader inflates compressed members, which DCP never writes.

Only regular files are read (a symbolic link, FIFO or device is refused), and ``.metadata`` only up to
:data:`MAX_METADATA_BYTES`.
"""

from __future__ import annotations

import io
import math
import os
import pathlib
import pickle
import re
import stat
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_md
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.filesystem import _StorageInfo

from ...errors import CheckpointError

__all__ = ["ALLOWED", "MAX_METADATA_BYTES", "SafeLoadPlanner", "SafeReader", "read_metadata"]

MAX_METADATA_BYTES = 256 << 20
"""Largest ``.metadata`` read (256 MiB): a model of thousands of tensors saved by hundreds of processes
writes tens of MB."""

_MD = "torch.distributed.checkpoint.metadata"
ALLOWED: dict[tuple[str, str], Any] = {
    (_MD, "Metadata"): dcp_md.Metadata,
    (_MD, "TensorStorageMetadata"): dcp_md.TensorStorageMetadata,
    (_MD, "BytesStorageMetadata"): dcp_md.BytesStorageMetadata,
    (_MD, "ChunkStorageMetadata"): dcp_md.ChunkStorageMetadata,
    (_MD, "TensorProperties"): dcp_md.TensorProperties,
    (_MD, "MetadataIndex"): dcp_md.MetadataIndex,
    (_MD, "StorageMeta"): dcp_md.StorageMeta,
    (_MD, "_MEM_FORMAT_ENCODING"): dcp_md._MEM_FORMAT_ENCODING,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,  # a lookup of torch.layout by name
    ("pathlib", "PosixPath"): pathlib.PosixPath,  # StorageMeta.checkpoint_id (no file is touched)
    ("pathlib._local", "PosixPath"): pathlib.PosixPath,
}
"""The globals a DCP ``.metadata`` pickle names (torch 2.14), and what each builds; dtypes (``torch.float32``
...) are allowed besides."""

_SHARD_FILE = re.compile(r"__\d{1,6}_\d{1,6}\.distcp")


class _Unpickler(pickle.Unpickler):
    def __init__(self, f: io.BytesIO, path: Path) -> None:
        super().__init__(f)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED.get((module, name))
        if found is not None:
            return found
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointError(
            f"{self.path}: refused to unpickle {module}.{name}: a sharded checkpoint's metadata holds only "
            "torch.distributed.checkpoint's metadata classes, and loading anything else could run code; "
            "the folder was not written by vitlab"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointError(f"{self.path}: refused to unpickle a persistent id: not a sharded checkpoint's metadata")


def _read_regular(path: Path, *, limit: int) -> bytes:
    """The bytes of ``path`` if it is a regular file (not a link, FIFO or device) of at most ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        what = "a symbolic link" if path.is_symlink() else (e.strerror or str(e))
        raise CheckpointError(f"{path}: cannot read the sharded checkpoint's metadata ({what})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{path}: not a regular file; refusing to read it")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise CheckpointError(f"{path}: larger than {limit >> 20} MiB; not the metadata of a sharded checkpoint")
    return data


def read_metadata(folder: Path) -> dcp_md.Metadata:
    """The checked metadata of the sharded checkpoint ``folder`` (see the module's docstring)."""
    path = folder / ".metadata"
    data = _read_regular(path, limit=MAX_METADATA_BYTES)
    try:
        md = _Unpickler(io.BytesIO(data), path).load()
    except CheckpointError:
        raise
    except Exception as e:  # truncated or malformed pickles, a failing constructor of an allowed class
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{path}: not the metadata of a sharded checkpoint ({first})") from None
    _check(md, folder, path)
    return md


def _check(md: Any, folder: Path, path: Path) -> None:
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: {what}; not the metadata of a sharded checkpoint vitlab wrote")

    if type(md) is not dcp_md.Metadata:
        raise bad(f"holds a {type(md).__name__}, not a Metadata")
    items, storage = md.state_dict_metadata, md.storage_data
    if type(items) is not dict or type(storage) is not dict:
        raise bad("its tables are not dicts")
    sizes: dict[str, int] = {}
    for index, info in storage.items():
        if type(index) is not dcp_md.MetadataIndex or type(info) is not _StorageInfo:
            raise bad(f"a storage entry of types {type(index).__name__}, {type(info).__name__}")
        name = info.relative_path
        if type(name) is not str or not _SHARD_FILE.fullmatch(name):
            raise bad(f"{index.fqn!r} is stored in {str(name)[:80]!r}, not a __<rank>_<n>.distcp file of the folder")
        if info.transform_descriptors:
            raise bad(f"{index.fqn!r} is stored through transforms {info.transform_descriptors!r}")
        if not (_is_int(info.offset) and _is_int(info.length) and info.offset >= 0 and info.length >= 0):
            raise bad(f"{index.fqn!r} has offset {info.offset!r} and length {info.length!r}")
        if name not in sizes:
            sizes[name] = _shard_size(folder / name)
        if info.offset + info.length > sizes[name]:
            raise bad(f"{index.fqn!r} lies beyond the end of {name} ({sizes[name]:,} bytes)")
    for fqn, item in items.items():
        if type(fqn) is not str:
            raise bad(f"an item named by a {type(fqn).__name__}")
        if type(item) is dcp_md.BytesStorageMetadata:
            if dcp_md.MetadataIndex(fqn) not in storage:
                raise bad(f"{fqn!r} is not stored in any file")
            continue
        if type(item) is not dcp_md.TensorStorageMetadata:
            raise bad(f"{fqn!r} is a {type(item).__name__}")
        _check_chunks(fqn, item, storage, bad)


def _check_chunks(fqn: str, item: Any, storage: dict, bad) -> None:
    """The chunks of a tensor item lie inside it, cover it exactly once (by volume), and each is stored."""
    if type(item.properties) is not dcp_md.TensorProperties or not isinstance(item.properties.dtype, torch.dtype):
        raise bad(f"{fqn!r} has no tensor properties")
    shape = item.size
    if type(shape) is not torch.Size or type(item.chunks) is not list:
        raise bad(f"{fqn!r} has no size or chunk list")
    covered = 0
    for c in item.chunks:
        if type(c) is not dcp_md.ChunkStorageMetadata or type(c.offsets) is not torch.Size:
            raise bad(f"{fqn!r} has a malformed chunk")
        if type(c.sizes) is not torch.Size or not len(c.offsets) == len(c.sizes) == len(shape):
            raise bad(f"{fqn!r} has a chunk of another rank than its size {tuple(shape)}")
        if any(o < 0 or s < 0 or o + s > n for o, s, n in zip(c.offsets, c.sizes, shape, strict=True)):
            raise bad(f"{fqn!r} has a chunk at {tuple(c.offsets)} of {tuple(c.sizes)} outside its size {tuple(shape)}")
        if dcp_md.MetadataIndex(fqn, c.offsets) not in storage:
            raise bad(f"{fqn!r} has a chunk at {tuple(c.offsets)} that is not stored in any file")
        covered += math.prod(c.sizes)
    if covered != math.prod(shape):
        raise bad(f"the chunks of {fqn!r} hold {covered:,} of its {math.prod(shape):,} values")


def _is_int(v: Any) -> bool:
    return type(v) is int


def _shard_size(path: Path) -> int:
    try:
        st = os.lstat(path)
    except OSError as e:
        raise CheckpointError(f"{path}: a shard of the sharded checkpoint is missing ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise CheckpointError(f"{path}: a shard of the sharded checkpoint is {kind}; refusing to read it")
    return st.st_size


class SafeReader(FileSystemReader):
    """DCP's file-system reader, handed the metadata :func:`read_metadata` checked: DCP never unpickles
    the folder's ``.metadata`` itself."""

    def __init__(self, folder: Path, metadata: dcp_md.Metadata) -> None:
        super().__init__(folder)
        self._metadata = metadata

    def _slice_file(self, file: Any, sinfo: _StorageInfo) -> Any:  # (FileSystemReader's hook for each item)
        _check_item(file, sinfo, Path(self.path) / sinfo.relative_path)
        return super()._slice_file(file, sinfo)

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_md.Metadata:
        if kwargs.get("rank") is not None:  # (DCP asks for per-rank metadata only when the global one failed)
            raise CheckpointError(f"{self.path}: no per-rank metadata is read")
        md = self._metadata
        if md.storage_meta is None:
            md.storage_meta = dcp_md.StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


class _Slice(io.RawIOBase):
    """``length`` bytes of ``f`` from ``offset``, as a seekable file (for :mod:`zipfile`)."""

    def __init__(self, f: Any, offset: int, length: int) -> None:
        super().__init__()
        self.f, self.offset, self.length, self.pos = f, offset, length, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.length}[whence]
        self.pos = min(max(base + pos, 0), self.length)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: Any) -> int:
        n = min(len(b), self.length - self.pos)
        self.f.seek(self.offset + self.pos)
        got = self.f.readinto(memoryview(b)[:n]) if n > 0 else 0
        self.pos += got or 0
        return got or 0


def _check_item(f: Any, info: _StorageInfo, where: Path) -> None:
    """The stored item (a ``torch.save`` zip) unpacks to no more than the bytes it occupies: DCP stores its
    members uncompressed, and torch's reader would inflate a compressed one whatever its size."""
    try:
        with zipfile.ZipFile(_Slice(f, info.offset, info.length)) as z:
            unpacked = sum(i.file_size for i in z.infolist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not a zip: torch.load refuses it
    if unpacked > info.length:
        raise CheckpointError(
            f"{where}: the item at byte {info.offset:,} unpacks to {unpacked:,} bytes from {info.length:,}; "
            "DCP stores items uncompressed, so it was not written by DCP"
        )


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, reading non-tensor items with ``torch.load(weights_only=True)``: each must be
    of the type of the value it replaces in this run's state (a float for a float, a list for a list)."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        info = self.metadata.storage_data.get(read_item.storage_index) if self.metadata is not None else None
        where = self.folder / (info.relative_path if info is not None else "?")
        current = self.state_dict.get(fqn)
        try:
            got = torch.load(value, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            m = re.search(r"GLOBAL (\S+)", str(e))
            what = m.group(1) if m else "an object torch's safe loader refuses"
            raise CheckpointError(f"{where}: refused to unpickle {what} in {fqn!r} (it could run code)") from None
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CheckpointError(f"{where}: {fqn!r} is not readable ({first})") from None
        if isinstance(current, torch.Tensor) or type(got) is not type(current):
            raise CheckpointError(
                f"{where}: {fqn!r} holds a {type(got).__name__} where this run has a {type(current).__name__}"
            )
        if self.flatten_state_dict:  # what DefaultLoadPlanner.load_bytes does with the value it unpickled
            set_element(self.original_state_dict, self.mappings[fqn], got)
        else:
            self.state_dict[fqn] = got

"""Reading tensors from files without ever running code from them.

``.safetensors`` holds tensors only; ``.pth``/``.bin``/``.pt`` files are pickles and
are read with ``torch.load(weights_only=True)``, which refuses any object that is
not a tensor or a plain container (a ``__reduce__`` payload raises instead of
running); ``.npz`` members are read as ``.npy`` arrays, never unpickling objects.
Every failure becomes a one-line :class:`~vitlab.errors.CheckpointError`.

Reads are bounded before they happen, as safetensors bounds every read by the header it
validates first. ``.npz`` files and PyTorch's zip checkpoints are zip archives whose members
may be compressed: the sizes the central directory states are checked against a limit before
anything is decompressed (:func:`unpacked_limit`), and an ``.npy`` header's shape must fit its
member. Legacy (non-zip) pickles store their tensors' bytes raw, so they hold no more than the
file's size. Config files (:func:`read_config_file`) are read only when they are regular files
(a FIFO would block, a device would never end) of at most :data:`MAX_CONFIG_BYTES`.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import stat
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointError, ConfigError
from ..models.config import check_fields

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_UNPACKED_ENV",
    "TORCH_SUFFIXES",
    "NpzArchive",
    "parse_config",
    "read_config_file",
    "read_npz",
    "read_state_dict",
    "stated_fields",
    "torch_load_safe",
    "unpacked_limit",
    "unwrap_state_dict",
]

TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pth.tar")
# Wrappers that training scripts put around the state dict, most specific first.
_WRAPPER_KEYS = ("state_dict", "model", "module", "model_state_dict", "model_state", "params")

MAX_CONFIG_BYTES = 4 << 20
"""Largest config file read (4 MiB); real ones are a few kB, a 21k-class ``id2label`` under 1 MB."""
MAX_UNPACKED_ENV = "VITLAB_MAX_UNPACKED_BYTES"
"""Environment variable that raises (or lowers) :func:`unpacked_limit` for every load: ``8G``, ``20GiB`` ..."""
_UNPACKED_FLOOR = 256 << 20
_UNPACKED_RATIO = 4


def _first_line(e: BaseException) -> str:
    msg = str(e).strip()
    return msg.splitlines()[0] if msg else type(e).__name__


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def unpacked_limit(path: Path, max_unpacked_bytes: int | None = None) -> int:
    """Most bytes the members of the archive ``path`` may unpack to, all members read together.

    ``max_unpacked_bytes`` if given, else ``$VITLAB_MAX_UNPACKED_BYTES`` (``8G`` ...), else
    4 times the file's size or 256 MiB, whichever is larger. Real weights barely compress (the
    official ``.npz`` files and PyTorch's zip checkpoints store their members uncompressed, so a
    2.5 GB ViT-H file unpacks to 2.5 GB), while a zip bomb unpacks to a thousand times its size.
    """
    if max_unpacked_bytes is not None:
        return int(max_unpacked_bytes)
    env = os.environ.get(MAX_UNPACKED_ENV)
    if env:
        from .._units import parse_size

        try:
            return parse_size(env)
        except ValueError as e:
            raise CheckpointError(f"{MAX_UNPACKED_ENV}: {e}") from None
    return max(_UNPACKED_FLOOR, _UNPACKED_RATIO * path.stat().st_size)


def _too_big(path: Path, what: str, size: int, limit: int) -> CheckpointError:
    return CheckpointError(
        f"{path}: {what} unpacks to {_mib(size)}, over the limit of {_mib(limit)} (a compressed archive that "
        f"inflates far beyond its {_mib(path.stat().st_size)} file); if you trust the file, raise the limit with "
        f"max_unpacked_bytes=... or {MAX_UNPACKED_ENV}=SIZE"
    )


def _check_zip_members(path: Path, zf: zipfile.ZipFile, limit: int) -> None:
    """Refuse a zip whose members, as its central directory states them, unpack to more than ``limit``.

    Python's zipfile (and PyTorch's reader) never produce more than a member's stated size, so this
    bounds what decompression can allocate."""
    total = 0
    for info in zf.infolist():
        total += info.file_size
        if total > limit:
            raise _too_big(path, f"member {info.filename!r} (with those before it)", total, limit)


def read_config_file(path: str | os.PathLike[str], *, max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """The JSON object in the config file ``path``, read only if it is a regular file of at most
    ``max_bytes``: a FIFO would block the reader forever and a device (``/dev/zero``) never ends.

    Symlinks to regular files are followed (the Hugging Face cache links snapshots to blobs).
    The file is opened non-blocking and checked again through its descriptor, so swapping it for
    a FIFO between the check and the open cannot hang either. Raises :class:`CheckpointError`
    naming the file: missing, not regular, too large, not UTF-8 JSON, nested too deeply, or not
    an object."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise CheckpointError(f"{p}: cannot read the config ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) else "not a file"
            raise CheckpointError(f"{p}: the config is {kind}, not a regular file; refusing to read it")
        data = f.read(max_bytes + 1)
    return parse_config(data, where=str(p), max_bytes=max_bytes)


def parse_config(data: bytes, *, where: str, max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """The JSON object in the config bytes ``data`` (of a file, or an array inside one: ``where`` names
    it in errors): at most ``max_bytes``, UTF-8, not nested too deeply, an object."""
    if len(data) > max_bytes:
        raise CheckpointError(f"{where}: the config is larger than {_mib(max_bytes)}; refusing to read it")
    try:
        raw = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise CheckpointError(f"{where}: not a readable config (JSON nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, ints of thousands of digits
        raise CheckpointError(f"{where}: not a readable config ({_first_line(e)})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where}: the config holds a JSON {type(raw).__name__}, not an object of fields")
    return raw


def read_state_dict(path: str | os.PathLike[str], *, max_unpacked_bytes: int | None = None) -> dict[str, torch.Tensor]:
    """The flat ``{name: tensor}`` of a ``.safetensors`` or PyTorch pickle file."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{p}: no such checkpoint file")
    with open(p, "rb") as f:
        magic = f.read(9)
    if p.suffix.lower() == ".safetensors" or (len(magic) == 9 and magic[8:9] == b"{" and not magic.startswith(b"PK")):
        from safetensors.torch import load_file

        try:
            return load_file(str(p))
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{p}: not a readable safetensors file ({_first_line(e)})") from None
    if p.suffix.lower() == ".onnx":
        raise CheckpointError(
            f"{p}: an ONNX model (as vitlab export writes), not a checkpoint of weights; load the model it was "
            "exported from, or run it with vitlab.export.load_exported"
        )
    obj = torch_load_safe(p, max_unpacked_bytes=max_unpacked_bytes)
    return unwrap_state_dict(obj, source=str(p))


def torch_load_safe(p: Path, *, what: str = "PyTorch checkpoint", max_unpacked_bytes: int | None = None) -> Any:
    """``torch.load(weights_only=True)`` with one-line errors: a file whose pickle holds anything
    but tensors and plain containers is refused by name (loading it could run code). A zip
    container's members are checked against :func:`unpacked_limit` before torch inflates any."""
    if zipfile.is_zipfile(p):
        try:
            with zipfile.ZipFile(p) as zf:
                _check_zip_members(p, zf, unpacked_limit(p, max_unpacked_bytes))
                torchscript = any(n.partition("/")[2] == "constants.pkl" for n in zf.namelist())
        except zipfile.BadZipFile as e:
            raise CheckpointError(f"{p}: not a {what} ({_first_line(e)})") from None
        if torchscript:  # (torch.load would warn, then refuse it under weights_only, suggesting weights_only=False)
            raise CheckpointError(
                f"{p}: a TorchScript program (as vitlab export --format torchscript writes), not a {what}; "
                "vitlab does not load TorchScript (loading it runs the program it holds): load the model it was "
                "exported from, or run it with vitlab.export.load_exported(path, format='torchscript') if you trust it"
            )
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols it may not read; the error below says it
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        m = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if m:
            raise CheckpointError(
                f"{p}: refused to unpickle: the file holds a {m.group(1)} object, not only tensors, "
                "and loading it could run code (vitlab reads pickles with torch.load(weights_only=True)); "
                "if you trust it, re-save it as a plain state dict or .safetensors"
            ) from None
        raise CheckpointError(f"{p}: not a {what} (pickle data that torch's safe loader cannot read)") from None
    except Exception as e:  # zip/pickle/EOF errors of random or truncated files
        raise CheckpointError(f"{p}: not a {what} ({_first_line(e)})") from None


def unwrap_state_dict(obj: Any, *, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Find the state dict inside what a training script saved: ``{"model": sd, "epoch": 3}``,
    ``{"state_dict": sd}``, DataParallel's ``module.`` prefixes ... (tensors only)."""
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{source}: holds a {type(obj).__name__}, not a state dict of named tensors")
    for key in _WRAPPER_KEYS:
        inner = obj.get(key)
        if isinstance(inner, Mapping) and any(isinstance(v, torch.Tensor) for v in inner.values()):
            obj = inner
            break
    state = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not state:
        raise CheckpointError(f"{source}: holds no tensors (keys: {', '.join(map(str, list(obj)[:6])) or 'none'})")
    for prefix in ("module.", "_orig_mod."):  # DataParallel/DDP, torch.compile
        if all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    return state


class NpzArchive(Mapping[str, np.ndarray]):
    """The arrays of an ``.npz`` file, each read when first asked for (and kept).

    Before a member is decompressed, its stated size plus those already read must stay within
    :func:`unpacked_limit`, and its ``.npy`` header must describe a numeric array that fits in
    the member; object arrays (pickles) are refused. Members never asked for are never read.
    """

    def __init__(self, path: Path, *, max_unpacked_bytes: int | None = None) -> None:
        self.path = path
        self.limit = unpacked_limit(path, max_unpacked_bytes)
        self._zip = zipfile.ZipFile(path)
        self._infos = {i.filename[:-4]: i for i in self._zip.infolist() if i.filename.endswith(".npy")}
        self._arrays: dict[str, np.ndarray] = {}
        self._read = 0
        try:  # every header (a few hundred bytes each) up front: object arrays are refused wherever they are
            for key, info in self._infos.items():
                self._check_header(key, info)
        except CheckpointError:
            self.close()
            raise
        except Exception as e:  # zlib, malformed headers
            self.close()
            raise CheckpointError(f"{path}: array {key!r} is not readable ({_first_line(e)})") from None

    def __enter__(self) -> NpzArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._zip.close()

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)

    def __contains__(self, key: object) -> bool:
        return key in self._infos

    def _check_header(self, key: str, info: zipfile.ZipInfo) -> None:
        fmt = np.lib.format
        with self._zip.open(info) as f:
            version = fmt.read_magic(f)
            header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = header(f, max_header_size=10_000)
        if dtype.hasobject:
            raise CheckpointError(
                f"{self.path}: refused to load pickled objects from .npz (allow_pickle=False); "
                f"{key!r} is an object array, only numeric arrays load"
            )
        need = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if need > info.file_size:
            raise CheckpointError(
                f"{self.path}: array {key!r}: its header claims shape {shape} ({_mib(need)}) but the member "
                f"holds {_mib(info.file_size)}"
            )

    def __getitem__(self, key: str) -> np.ndarray:
        if key in self._arrays:
            return self._arrays[key]
        info = self._infos[key]
        self._read += info.file_size
        if self._read > self.limit:
            raise _too_big(self.path, f"array {key!r} (with those read before it)", self._read, self.limit)
        try:
            with self._zip.open(info) as f:
                a = np.lib.format.read_array(f, allow_pickle=False)
        except Exception as e:  # zlib, CRC, truncated data
            raise CheckpointError(f"{self.path}: array {key!r} is not readable ({_first_line(e)})") from None
        self._arrays[key] = a
        return a


def read_npz(path: str | os.PathLike[str], *, max_unpacked_bytes: int | None = None) -> NpzArchive:
    """The arrays of an ``.npz`` file, read lazily and within bounds (:class:`NpzArchive`); close it after use."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{p}: no such checkpoint file")
    with open(p, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        raise CheckpointError(f"{p}: a single .npy array, not an .npz archive of named arrays")
    try:
        return NpzArchive(p, max_unpacked_bytes=max_unpacked_bytes)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(f"{p}: not a readable .npz archive ({_first_line(e)})") from None


def stated_fields(raw: Mapping[str, Any], names: tuple[tuple[str, str], ...], *, source: str) -> dict[str, Any]:
    """The ViTConfig fields a config file states: for each ``(field, key)`` of ``names`` whose key ``raw`` has, its
    value type- and range-checked (:func:`~vitlab.models.config.check_fields`); a bad one is a
    :class:`CheckpointError` naming ``source`` and the file's own key."""
    fields: dict[str, Any] = {}
    for ours, theirs in names:
        if theirs in raw:
            try:
                fields.update(check_fields({ours: raw[theirs]}))
            except ConfigError as e:
                raise CheckpointError(f"{source}: {theirs}{str(e)[len(ours) :]}") from None
    return fields

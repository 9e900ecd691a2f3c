"""Sharded checkpoints of ``--fsdp`` runs, through ``torch.distributed.checkpoint`` (DCP).

A sharded run's ``last.pt`` holds everything but the weights and the optimizer state (position,
schedule, RNG states, plan, configuration) and names the folder that holds those two:
``sharded/step-<step>-<token>/``, where each process wrote its own shards (``__<rank>_0.distcp``)
and rank 0 the ``.metadata`` that maps every tensor's pieces to files. DCP reads such a folder back
on any number of processes, each loading the slices its own shards need: save with 8, resume with 1.

A save is a collective and never leaves a half-written folder that could be taken for a complete
one: every rank writes into ``sharded/.<name>-<tag>.tmp``; when all have finished (DCP's own final
collective, after which the metadata is written), rank 0 renames it to ``sharded/<name>``, then
writes ``last.pt`` naming it (:func:`~vitlab.train.persist.state.atomic_torch_save`), and only then deletes
the folders ``last.pt`` no longer names (:func:`prune`). A kill at any moment leaves ``last.pt``
naming a complete folder: the previous one until the new ``last.pt`` is in place. What killed saves
and deletions leave is deleted by the next save (the run folder's lock keeps out other writers).

``sharded/`` may be a symbolic link (to a larger disk), which other runs or programs may share. Writing
follows it; deleting never removes what this run folder's runs did not write: only real folders (never
a link) that are either named ``step-<8 digits>-<8 hex>`` (or ``.step-...tmp``) and hold the marker
file vitlab writes into each folder (:data:`MARKER`) carrying the run folder's token (:data:`TOKEN_FILE`,
random, kept in the run folder), or carry the token's tag (its first 16 hex digits) in their name: the
temporary folder of a save (``.step-<8 digits>-<8 hex>-<tag>.tmp``, named before its marker is written,
so that a kill in between leaves a folder still known as this run's) and a folder being deleted
(renamed ``.trash-<8 hex>-<tag>`` first, so that a kill half-way leaves it known as this run's).

Reading is as safe as reading ``last.pt``: DCP's pickled ``.metadata`` and the pickled non-tensor items
inside its shards are read by :mod:`vitlab.train.persist.dcp_safe` (a restricted unpickler and
``torch.load(weights_only=True)``), never by ``pickle.load``; the folder ``last.pt`` names must be
``sharded/step-<digits>-<hex>`` and a real folder (:func:`sharded_folder`).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..._fs import fsync_dir
from ...distributed import Dist, barrier, broadcast_ints
from ...errors import CheckpointError

__all__ = ["MARKER", "SHARDED_DIR", "TOKEN_FILE", "clear", "prune", "read_sharded", "sharded_folder", "write_sharded"]

SHARDED_DIR = "sharded"
"""The run folder's sub-folder of sharded checkpoints."""
MARKER = ".vitlab-sharded"
"""The file vitlab writes into each folder of sharded checkpoints it creates, before anything else."""
TOKEN_FILE = ".sharded-token"
"""The run folder's file holding the random token its markers carry."""
_NAME = re.compile(r"step-\d{8,12}-[0-9a-f]{8}")
_TMP = re.compile(r"\.step-\d{8,12}-[0-9a-f]{8}(?:-(?P<tag>[0-9a-f]{16}))?\.tmp")
_TRASH = re.compile(r"\.trash-[0-9a-f]{8}-(?P<tag>[0-9a-f]{16})")
_TOKEN = re.compile(r"[0-9a-f]{32}")


def write_sharded(
    out: Path, *, net: nn.Module, optimizer: torch.optim.Optimizer, step: int, d: Dist, device: torch.device
) -> str:
    """Save the sharded ``net``'s weights and ``optimizer``'s state (a collective: every rank calls it)
    into a new folder under ``out/sharded``; its name relative to ``out``, for ``last.pt``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = out / SHARDED_DIR
    why, token = _token(out) if d.is_main else ("", "0" * 32)
    nums = broadcast_ints([secrets.randbits(31), int(token[:8], 16), int(token[8:16], 16)], d, device)
    name, tag = f"step-{step:08d}-{nums[0]:08x}", f"{nums[1]:08x}{nums[2]:08x}"  # one name on every rank
    tmp = root / f".{name}-{tag}.tmp"
    why = why or (_prepare(tmp, token) if d.is_main else "")
    (failed,) = broadcast_ints([int(bool(why))], d, device)  # the folder exists, marked, before any rank writes
    if failed:
        raise CheckpointError(f"{tmp}: cannot write the sharded checkpoint ({why or 'failed on rank 0'})")
    model_state, optim_state = get_state_dict(net, optimizer)
    try:
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp)
    except (OSError, dcp.CheckpointException) as e:  # DCP gathers every rank's failure into the latter
        kept = "the previous checkpoint is kept" if (out / "last.pt").is_file() else "no checkpoint was written"
        raise CheckpointError(f"{tmp}: cannot write the sharded checkpoint ({_cause(e)}); {kept}") from None
    barrier(d)
    if d.is_main:
        os.replace(tmp, root / name)
        fsync_dir(root)
    return f"{SHARDED_DIR}/{name}"


def _token(out: Path) -> tuple[str, str]:
    """Why the run folder's token cannot be had (or ``""``), and the token (rank 0; made when missing)."""
    try:
        return "", str(run_token(out))
    except OSError as e:
        return e.strerror or str(e), "0" * 32


def _prepare(tmp: Path, token: str) -> str:
    """Make the folder ``tmp`` of a save with the marker of ``token`` in it, after deleting what this run's
    killed saves and deletions left (rank 0; the run holds the run folder's lock); why not, or ``""``."""
    try:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        for p in _ours(tmp.parent, token):
            if not _NAME.fullmatch(p.name):
                _remove(p, token)
        tmp.mkdir()
        (tmp / MARKER).write_text(_marker(token))
    except OSError as e:
        return e.strerror or str(e)
    return ""


def prune(out: Path, *, keep: str) -> None:
    """Delete the sharded checkpoints this run folder's runs wrote other than ``keep`` (rank 0, after
    ``last.pt`` names ``keep``); anything else in ``sharded/`` (or where it links to) is left alone."""
    token = run_token(out, create=False)
    for p in _ours(out / SHARDED_DIR, token):
        if p.name != Path(keep).name:
            _remove(p, token)


def clear(out: Path) -> list[str]:
    """``--overwrite``: delete the sharded checkpoints this run folder's runs wrote and its token file,
    then ``sharded/`` itself if it is a real folder left empty (a link the user made is kept, to be
    written through again). The names of what is left in ``sharded/``, which vitlab did not write."""
    root = out / SHARDED_DIR
    token = run_token(out, create=False)
    for p in _ours(root, token):
        _remove(p, token)
    (out / TOKEN_FILE).unlink(missing_ok=True)
    if root.is_symlink() or not root.is_dir():
        return []
    left = sorted(p.name for p in root.iterdir())
    if not left:
        root.rmdir()
    return left


def run_token(out: Path, *, create: bool = True) -> str | None:
    """The run folder's token (:data:`TOKEN_FILE`), made when missing or not one (``create``)."""
    path = out / TOKEN_FILE
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_size == 33:
            text = path.read_text(encoding="ascii", errors="replace").strip()
            if _TOKEN.fullmatch(text):
                return text
    except OSError:
        pass
    if not create:
        return None
    text = secrets.token_hex(16)
    tmp = path.with_name(f".{TOKEN_FILE}.tmp{os.getpid()}")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)  # (over a link or a bad file: the entry itself is replaced, nothing it points to)
    return text


def _marker(token: str) -> str:
    return f"vitlab sharded checkpoint of the run with token {token}\n"


def _ours(root: Path, token: str | None) -> list[Path]:
    """The entries of ``root`` this run folder's runs wrote, real folders (not links): named as vitlab
    names them and holding a marker file with ``token``, or carrying ``token``'s tag in their name (a
    save's temporary folder, a folder being deleted). None without a token."""
    if token is None or not root.is_dir():
        return []
    want = _marker(token).encode()
    found = []
    for p in root.iterdir():
        named = _NAME.fullmatch(p.name) or _TMP.fullmatch(p.name) or _TRASH.fullmatch(p.name)
        if not named:
            continue
        try:
            if not stat.S_ISDIR(os.lstat(p).st_mode):
                continue
            if named.groupdict().get("tag") == token[:16]:
                found.append(p)
                continue
            m = os.lstat(p / MARKER)
            if stat.S_ISREG(m.st_mode) and m.st_size == len(want) and (p / MARKER).read_bytes() == want:
                found.append(p)
        except OSError:
            continue
    return found


def _remove(p: Path, token: str | None) -> None:
    """Delete the folder ``p`` of this run's: renamed ``.trash-<8 hex>-<tag>`` first, so that a kill
    half-way leaves a folder the next save still knows as this run's (its marker may be gone); a link
    is never followed (``shutil.rmtree`` refuses one at the top and removes links inside it as links)."""
    if token is not None and not _TRASH.fullmatch(p.name):
        trash = p.with_name(f".trash-{secrets.token_hex(4)}-{token[:16]}")
        try:
            os.rename(p, trash)
            p = trash
        except OSError:
            pass
    shutil.rmtree(p, ignore_errors=True)


def sharded_folder(out: Path, name: Any) -> Path:
    """The folder of sharded checkpoints ``last.pt`` names as ``name``: exactly
    ``sharded/step-<8 digits>-<8 hex digits>`` under ``out`` and a real folder, not a link."""
    prefix = f"{SHARDED_DIR}/"
    if not isinstance(name, str) or not (name.startswith(prefix) and _NAME.fullmatch(name[len(prefix) :])):
        raise CheckpointError(
            f"{out / 'last.pt'}: names the sharded checkpoint {str(name)[:80]!r}, not "
            f"{SHARDED_DIR}/step-<8 digits>-<8 hex digits>; it was not written by vitlab"
        )
    folder = out / name
    if folder.is_symlink():
        raise CheckpointError(
            f"{folder}: is a symbolic link, not the folder vitlab wrote; refusing to read a checkpoint through it"
        )
    return folder


def read_sharded(folder: Path, *, net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load the weights and optimizer state saved in ``folder`` into ``net`` and ``optimizer`` (a
    collective), resharded to this run's processes; ``net`` may be sharded or not."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from .dcp_safe import SafeLoadPlanner, SafeReader, read_metadata  # lazy: DCP's reader, for sharded resumes only

    if not (folder / ".metadata").is_file():
        raise CheckpointError(
            f"{folder}: the sharded checkpoint last.pt names is missing or incomplete (no .metadata); "
            "start a new run (--overwrite)"
        )
    metadata = read_metadata(folder)  # checked, and never by pickle.load
    model_state, optim_state = get_state_dict(net, optimizer)  # this run's layout: what each rank loads into
    state = {"model": model_state, "optim": optim_state}
    try:
        dcp.load(state, storage_reader=SafeReader(folder, metadata), planner=SafeLoadPlanner(folder))
    except (Exception, dcp.CheckpointException) as e:  # a missing shard, a changed model, on any rank
        if isinstance(_first(e), CheckpointError):  # dcp_safe's refusals name the file and say why
            raise CheckpointError(str(_first(e))) from None
        raise CheckpointError(f"{folder}: cannot read the sharded checkpoint ({_cause(e)})") from None
    set_state_dict(net, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _first(e: BaseException) -> BaseException:
    """The first rank's failure when DCP gathered them (``CheckpointException.failures``), else ``e``."""
    failures = getattr(e, "failures", None)
    if failures:
        first = failures[min(failures)]
        return first[0] if isinstance(first, tuple) else first
    return e


def _cause(e: BaseException) -> str:
    """One line for ``e``: the first rank's failure when DCP gathered them."""
    e = _first(e)
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__

"""Untrusted checkpoints cannot run code: a ``__reduce__`` payload in every file type a loader accepts.

The payload would create a file when unpickled; each load must raise a one-line
:class:`~vitlab.errors.CheckpointError` and the file must never appear.
(tests/test_checkpoints_native.py covers a bare ``.pth``; this covers every other path.)
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

import vitlab
from vitlab.checkpoints.files import TORCH_SUFFIXES
from vitlab.cli import main
from vitlab.errors import CheckpointError
from vitlab.train.persist.state import load_state


class _Payload:
    """Unpickling this calls ``open(target, "w")``: it would create ``target``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def _evil_torch(path, target, *, legacy: bool) -> None:
    obj = {"state_dict": {"cls_token": torch.zeros(1, 1, 8)}, "hook": _Payload(str(target))}
    if legacy:  # a plain pickle stream, as old torch.save and pickle.dump write
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=2)
    else:  # torch's zip container with the payload inside data.pkl
        torch.save(obj, path)


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("suffix", [*TORCH_SUFFIXES, ".safetensors", ".pkl"])
def test_pickle_payload_in_every_weights_extension(tmp_path, suffix, legacy):
    target = tmp_path / "pwned"
    path = tmp_path / f"evil{suffix}"
    _evil_torch(path, target, legacy=legacy)
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg
    assert not target.exists()


def test_pickle_payload_in_folders(tmp_path):
    """A Hugging Face folder with pytorch_model.bin, and a timm Hub snapshot folder."""
    target = tmp_path / "pwned"
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "vit", "hidden_size": 8, "num_attention_heads": 2}))
    _evil_torch(hf / "pytorch_model.bin", target, legacy=False)
    snap = tmp_path / "timm_snapshot"
    snap.mkdir()
    _evil_torch(snap / "pytorch_model.bin", target, legacy=True)
    for folder in (hf, snap):
        with pytest.raises(CheckpointError, match="refused to unpickle"):
            vitlab.load(folder)
    assert not target.exists()


def test_object_arrays_in_npz_are_refused(tmp_path):
    target = tmp_path / "pwned"
    path = tmp_path / "evil.npz"
    np.savez(
        path,
        **{
            "embedding/kernel": np.zeros((4, 4, 3, 8), np.float32),
            "cls": np.array([_Payload(str(target))], dtype=object),
        },
    )
    with pytest.raises(CheckpointError, match="refused to load pickled objects"):
        vitlab.load(path)
    single = tmp_path / "evil.npy.npz"  # a lone object .npy saved under an .npz name
    with open(single, "wb") as f:
        np.save(f, np.array([_Payload(str(target))], dtype=object))
    with pytest.raises(CheckpointError):
        vitlab.load(single)
    assert not target.exists()


def test_resume_state_with_a_payload_is_refused(tmp_path, capsys):
    """``last.pt`` is read with weights_only=True, through the library and through ``--resume``."""
    target = tmp_path / "pwned"
    out = tmp_path / "run"
    out.mkdir()
    torch.save({"step": 3, "config": "{}", "rng": _Payload(str(target))}, out / "last.pt")
    with pytest.raises(CheckpointError, match="cannot read the resume checkpoint"):
        load_state(out / "last.pt")
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "last.pt" in err
    assert not target.exists()


def test_cli_commands_refuse_the_payload(tmp_path, capsys):
    target = tmp_path / "pwned"
    evil = tmp_path / "evil.pth"
    _evil_torch(evil, target, legacy=False)
    img = tmp_path / "x.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(img)
    for argv in (
        ["convert", str(evil), str(tmp_path / "out")],
        ["predict", "--model", str(evil), str(img)],
        ["eval", "--model", str(evil), "--data", "digits"],
        ["finetune", "--init", str(evil), "--data", "digits", "--out", str(tmp_path / "ft"), "--no-progress"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "refused to unpickle" in err, (argv, err)
    assert not target.exists()


def test_a_small_file_is_read_within_its_bound_and_never_through_a_refused_link(tmp_path):
    """The one bounded read (vitlab._fs.read_small) behind config files, manifests, cache settings and sizing.json:
    a folder, a FIFO (the open does not block) and, where refused, a link are not files; a file over the bound is
    refused from its size before it is read."""
    import os

    import pytest

    from vitlab._fs import NotAFile, TooLarge, read_small

    f = tmp_path / "small.json"
    f.write_bytes(b"x" * 10)
    assert read_small(f, limit=10) == b"x" * 10
    with pytest.raises(TooLarge) as e:
        read_small(f, limit=9)
    assert e.value.size == 10
    (tmp_path / "link.json").symlink_to(f)
    assert read_small(tmp_path / "link.json", limit=10) == b"x" * 10
    with pytest.raises(NotAFile):
        read_small(tmp_path / "link.json", limit=10, links=False)
    with pytest.raises(NotAFile):
        read_small(tmp_path, limit=10)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(NotAFile):
        read_small(tmp_path / "fifo", limit=10)
    with pytest.raises(FileNotFoundError):
        read_small(tmp_path / "none.json", limit=10)

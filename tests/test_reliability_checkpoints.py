"""Sharded checkpoints, exported models, convert round trips and evaluation memory, as someone handed a
run folder or a model file would meet them (issue 33).

- An ``--fsdp`` run folder cannot run code on ``--resume``: not through DCP's pickled ``.metadata`` (a
  ``__reduce__`` payload, or one that runs and then returns the real metadata), not through the pickled
  non-tensor items inside its ``.distcp`` shards, not through a ``last.pt`` naming another folder.
- Nothing outside what vitlab wrote is deleted when ``sharded/`` links to a folder that holds other
  things (named like vitlab's or not), by the saves, their clean-up or ``--overwrite``.
"""

from __future__ import annotations

import operator
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.errors import CheckpointError
from vitlab.train.persist.dcp import MARKER, sharded_folder
from vitlab.train.persist.dcp_safe import read_metadata
from vitlab.train.persist.state import load_state

TINY = ["--recipe", "digits", "--batch-size", "8", "--patch-size", "4", "--dim", "16", "--depth", "2"]
TINY += ["--heads", "2", "--crop-scale", "1,1", "--no-progress", "--workers", "0", "--threads", "1"]


class _Payload:
    """Unpickling this calls ``open(target, "w")`` (``io.open``): it would create ``target``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


class _Eval:
    """Unpickling this calls ``eval`` on code that creates ``target``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (eval, (f"open({self.target!r}, 'w')",))


class _ThenReal:
    """Unpickling this runs ``_Payload`` and then gives ``real``: a crafted file that loads as if nothing happened."""

    def __init__(self, target: str, real) -> None:
        self.target, self.real = target, real

    def __reduce__(self):
        return (operator.itemgetter(1), ([_Payload(self.target), self.real],))


def train_args(data_dir: Path, out: Path, *extra: str) -> list[str]:
    cache = str(out.parent / "cache")
    return ["train", "--data", str(data_dir), "--out", str(out), "--cache-dir", cache, *TINY, *extra]


def resume_args(out: Path, *extra: str) -> list[str]:
    return ["train", "--out", str(out), "--resume", "--no-progress", "--workers", "0", *extra]


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("vitlab train: error: "), err
    return err


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("ckpt") / "rgb")


@pytest.fixture(scope="module")
def stopped_run(data_dir, tmp_path_factory):
    """An ``--fsdp`` run stopped after 2 steps of 6: ``last.pt`` names ``sharded/step-00000002-<hex>``."""
    out = tmp_path_factory.mktemp("base") / "run"
    assert main(train_args(data_dir, out, "--fsdp", "--epochs", "1", "--stop-after", "2")) == 0
    return out


def copy_run(stopped_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the stopped run and its sharded folder."""
    out = tmp_path / "run"
    shutil.copytree(stopped_run, out, symlinks=True)
    shutil.copytree(stopped_run.parent / "cache", tmp_path / "cache", dirs_exist_ok=True)
    return out, out / load_state(out / "last.pt")["sharded"]


def real_metadata(folder: Path):
    with open(folder / ".metadata", "rb") as f:
        return pickle.load(f)  # (the test's own file, written by the run above)


@pytest.mark.parametrize("variant", ["payload", "payload_then_real"])
def test_a_pickle_payload_in_the_metadata_is_refused_on_resume(stopped_run, tmp_path, capsys, variant):
    out, folder = copy_run(stopped_run, tmp_path)
    target = tmp_path / "pwned"
    obj = _Eval(str(target)) if variant == "payload" else _ThenReal(str(target), real_metadata(folder))
    (folder / ".metadata").write_bytes(pickle.dumps(obj))
    assert main(resume_args(out)) == 2
    err = one_line(capsys.readouterr().err)
    culprit = "builtins.eval" if variant == "payload" else "operator.itemgetter"
    assert f"{folder / '.metadata'}: refused to unpickle {culprit}" in err
    assert not target.exists()
    with pytest.raises(CheckpointError, match="refused to unpickle"):
        read_metadata(folder)


@pytest.mark.slow
def test_the_real_metadata_reads_back_and_the_run_resumes(stopped_run, tmp_path):
    out, folder = copy_run(stopped_run, tmp_path)
    md = read_metadata(folder)
    assert md.state_dict_metadata.keys() == real_metadata(folder).state_dict_metadata.keys()
    assert main(resume_args(out)) == 0
    assert load_state(out / "last.pt")["step"] == 6


def _bytes_item(folder: Path, payload: bytes, fqn: str = "optim.param_groups.0.lr") -> None:
    """Replace the stored value of the non-tensor item ``fqn`` by ``payload`` (appended to the shard),
    and rewrite the metadata to point at it (as a crafted checkpoint would)."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    md = real_metadata(folder)
    info = md.storage_data[MetadataIndex(fqn)]
    shard = folder / info.relative_path
    info.offset, info.length = shard.stat().st_size, len(payload)
    with open(shard, "ab") as f:
        f.write(payload)
    (folder / ".metadata").write_bytes(pickle.dumps(md))


def _torch_bytes(obj) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_a_pickle_payload_inside_a_shard_is_refused(stopped_run, tmp_path, capsys):
    """DCP reads non-tensor items (the optimizer's hyper-parameters) with torch.load(weights_only=False)."""
    out, folder = copy_run(stopped_run, tmp_path)
    target = tmp_path / "pwned"
    _bytes_item(folder, _torch_bytes(_Payload(str(target))))
    assert main(resume_args(out)) == 2
    err = one_line(capsys.readouterr().err)
    assert f"error: {folder / '__0_0.distcp'}: refused to unpickle io.open in 'optim.param_groups.0.lr'" in err
    assert not target.exists()


def test_a_shard_item_of_another_type_is_refused(stopped_run, tmp_path, capsys):
    out, folder = copy_run(stopped_run, tmp_path)
    _bytes_item(folder, _torch_bytes("1e9"))  # a string where the learning rate is a float
    assert main(resume_args(out)) == 2
    assert "'optim.param_groups.0.lr' holds a str where this run has a float" in one_line(capsys.readouterr().err)


def test_a_compressed_item_is_refused_before_it_is_inflated(stopped_run, tmp_path, capsys):
    """torch's zip reader inflates deflated members; DCP never writes them: 40 kB that would become 40 MB."""
    import io
    import zipfile

    out, folder = copy_run(stopped_run, tmp_path)
    plain = zipfile.ZipFile(io.BytesIO(_torch_bytes(torch.zeros(10_000_000))))
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name in plain.namelist():
            z.writestr(name, plain.read(name))
    assert len(packed.getvalue()) < 100_000
    _bytes_item(folder, packed.getvalue())
    assert main(resume_args(out)) == 2
    err = one_line(capsys.readouterr().err)
    assert f"error: {folder / '__0_0.distcp'}: the item at byte " in err and "unpacks to 40,000," in err


@pytest.mark.parametrize(
    "lie",
    ["outside", "beyond_end", "transform", "uncovered"],
)
def test_metadata_that_points_elsewhere_is_refused(stopped_run, tmp_path, capsys, lie):
    """Stored pieces must lie inside the folder's own ``__<rank>_<n>.distcp`` files, untransformed, and the
    chunks of a tensor must cover it (else part of a weight would silently keep its initial value)."""
    out, folder = copy_run(stopped_run, tmp_path)
    (tmp_path / "secret.distcp").write_bytes(b"x" * 100)
    md = real_metadata(folder)
    first = next(iter(md.storage_data.values()))
    if lie == "outside":
        first.relative_path = "../../secret.distcp"
    elif lie == "beyond_end":
        first.offset = 10**12
    elif lie == "transform":
        first.transform_descriptors = ["zstd/1"]
    else:
        item = md.state_dict_metadata["model.head.weight"]
        item.chunks = item.chunks[:0]
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    assert main(resume_args(out)) == 2
    err = one_line(capsys.readouterr().err)
    assert f"{folder / '.metadata'}: " in err and "not the metadata of a sharded checkpoint vitlab wrote" in err


@pytest.mark.parametrize(
    "name", ["/tmp", "sharded/../../elsewhere", "sharded/step-2-abc", "../run2/sharded/step-00000002-0822b729", 7]
)
def test_last_pt_naming_another_folder_is_refused(stopped_run, tmp_path, capsys, name):
    out, _ = copy_run(stopped_run, tmp_path)
    state = load_state(out / "last.pt")
    state["sharded"] = name
    torch.save(state, out / "last.pt")
    assert main(resume_args(out)) == 2
    err = one_line(capsys.readouterr().err)
    if isinstance(name, str):
        assert "not sharded/step-<8 digits>-<8 hex digits>; it was not written by vitlab" in err
    else:  # not a name at all: refused when last.pt is read, before any folder is looked at
        assert "not a resume checkpoint vitlab can continue from: sharded: expected a folder name, got int" in err


def test_a_linked_step_folder_is_refused(stopped_run, tmp_path, capsys):
    out, folder = copy_run(stopped_run, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere)
    assert main(resume_args(out)) == 2
    assert f"{folder}: is a symbolic link" in one_line(capsys.readouterr().err)
    with pytest.raises(CheckpointError, match="symbolic link"):
        sharded_folder(out, f"sharded/{folder.name}")


def _foreign(big: Path) -> dict[str, bytes]:
    """Fill ``big`` with what another program and another run keep there; ``{relative path: bytes}``."""
    files = {
        "notes.txt": b"mine",
        ".cache.tmp/blob": b"a cache being written",
        "other_run/weights.bin": b"weights",
        "step-00000001-deadbeef/__0_0.distcp": b"named like vitlab's, no marker",
        ".step-00000001-deadbeef.tmp/data": b"named like vitlab's, no marker",
        # another run's checkpoint: vitlab's name and marker, another run's token
        f"step-00000004-0badcafe/{MARKER}": b"vitlab sharded checkpoint of the run with token " + b"0" * 32 + b"\n",
        "step-00000004-0badcafe/__0_0.distcp": b"another run's shard",
        "linked_target/keep.txt": b"behind a link",
    }
    for rel, data in files.items():
        (big / rel).parent.mkdir(parents=True, exist_ok=True)
        (big / rel).write_bytes(data)
    (big / "step-00000003-aaaaaaaa").symlink_to(big / "linked_target")  # a link named like vitlab's folders
    return files


def _intact(big: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        assert (big / rel).read_bytes() == data, rel
    assert (big / "step-00000003-aaaaaaaa").is_symlink()


@pytest.mark.slow
def test_a_linked_sharded_folder_keeps_what_vitlab_did_not_write(data_dir, tmp_path, capsys):
    """``sharded/`` links to a folder on a larger disk that holds other things: the run's saves, the clean-up of
    a failed save, pruning and ``--overwrite`` delete only this run's checkpoints."""
    big = tmp_path / "big"
    big.mkdir()
    files = _foreign(big)
    out = tmp_path / "run"
    out.mkdir()
    (out / "sharded").symlink_to(big)
    assert main(train_args(data_dir, out, "--fsdp", "--epochs", "2", "--save-every", "0.0001")) == 0
    _intact(big, files)
    name = Path(load_state(out / "last.pt")["sharded"]).name
    ours = [p.name for p in big.iterdir() if p.name.startswith(("step-", ".step-")) and p.name not in _names(files)]
    assert ours == [name]  # every earlier save pruned

    (big / f".step-00000009-{'1' * 8}.tmp").mkdir()  # a killed save of this run: marked, and cleaned up
    (big / f".step-00000009-{'1' * 8}.tmp" / MARKER).write_bytes((big / name / MARKER).read_bytes())
    capsys.readouterr()
    assert main(train_args(data_dir, out, "--fsdp", "--epochs", "1", "--stop-after", "3", "--overwrite")) == 0
    assert "removed the previous run's" in capsys.readouterr().out
    _intact(big, files)
    assert (out / "sharded").is_symlink()  # the user's link is kept, and written through
    now = Path(load_state(out / "last.pt")["sharded"]).name
    assert [p.name for p in big.iterdir() if p.name not in _names(files)] == [now]


def _names(files: dict[str, bytes]) -> set[str]:
    return {rel.split("/")[0] for rel in files} | {"step-00000003-aaaaaaaa"}


@pytest.mark.slow
def test_overwrite_keeps_what_vitlab_did_not_write_in_a_real_sharded_folder(stopped_run, tmp_path, data_dir, capsys):
    out, folder = copy_run(stopped_run, tmp_path)
    (out / "sharded" / "notes.txt").write_text("mine")
    (out / "sharded" / "step-00000001-deadbeef").mkdir()
    assert main(train_args(data_dir, out, "--epochs", "1", "--stop-after", "1", "--overwrite")) == 0
    log = capsys.readouterr().out
    assert "kept 2 entries vitlab did not write (notes.txt, step-00000001-deadbeef)" in log
    assert (out / "sharded" / "notes.txt").read_text() == "mine" and not folder.exists()
    assert not os.path.exists(out / ".sharded-token")


# -- exported models ------------------------------------------------------------------------------------------


def _tiny_vit(**fields):
    from vitlab.models import VisionTransformer, ViTConfig

    cfg = dict(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, mlp_dim=64, num_classes=5)
    model = VisionTransformer(ViTConfig(**{**cfg, **fields}))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))  # (the head starts at zero)
    return model.eval()


@pytest.fixture(scope="module")
def torchscript_file(tmp_path_factory):
    from vitlab.export import export_model

    return export_model(_tiny_vit(), tmp_path_factory.mktemp("ts") / "m.pt", format="torchscript").path


def test_load_exported_runs_torchscript_only_when_asked_by_name(torchscript_file, tmp_path, monkeypatch):
    """``torch.jit.load`` runs the program a file holds: a path not named .onnx is never taken for TorchScript."""
    from vitlab.export import ExportError, load_exported

    calls = []
    real = torch.jit.load
    monkeypatch.setattr(torch.jit, "load", lambda *a, **k: calls.append(a) or real(*a, **k))
    for name in ("m.pt", "m.bin", "m"):
        shutil.copy(torchscript_file, tmp_path / name)
        with pytest.raises(ExportError, match="TorchScript is loaded only when asked by name") as e:
            load_exported(tmp_path / name)
        assert "\n" not in str(e.value)
    assert calls == []
    assert load_exported(torchscript_file, format="torchscript") is not None
    assert load_exported(torchscript_file, trust_torchscript=True) is not None
    assert len(calls) == 2
    with pytest.raises(ExportError, match="format"):
        load_exported(torchscript_file, format="pickle")


def test_commands_refuse_a_torchscript_file_in_one_line(torchscript_file, tmp_path, capsys, recwarn):
    """``vitlab predict/eval/convert`` read models with torch.load(weights_only=True): a TorchScript file is named
    as such (not with torch's advice to retry with weights_only=False), and no warning is printed."""
    img = tmp_path / "x.png"
    from PIL import Image

    Image.new("RGB", (16, 16)).save(img)
    convert = ["convert", str(torchscript_file), str(tmp_path / "o")]
    for argv in (["predict", "--model", str(torchscript_file), str(img)], convert):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "a TorchScript program (as vitlab export --format torchscript writes)" in err
        assert "weights_only=False" not in err
    assert not [w for w in recwarn if "TorchScript" in str(w.message)]


def test_export_prints_no_torch_deprecation_warning(tmp_path, capsys):
    import warnings

    import vitlab

    vitlab.save(_tiny_vit(), tmp_path / "m")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["export", "--model", str(tmp_path / "m"), "--format", "torchscript"]) == 0
    assert [str(w.message) for w in seen] == []
    assert "exported " in capsys.readouterr().out  # the export's own success line


# -- convert round trips ----------------------------------------------------------------------------------------


def _roundtrip_model(**fields):
    from vitlab.models import VisionTransformer, ViTConfig

    base = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3)
    model = VisionTransformer(ViTConfig(**{**base, **fields}))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    act=st.sampled_from(["gelu", "gelu_tanh"]),
    posemb=st.sampled_from(["learn", "sincos2d", "none"]),
    img=st.sampled_from([16, 24, 40]),
    layout=st.sampled_from(["vit_jax", "big_vision"]),
    pool=st.sampled_from(["cls", "gap"]),
    qkv_bias=st.booleans(),
    norm=st.sampled_from([None, ((0.1, 0.2, 0.3), (0.3, 0.2, 0.1))]),
    named=st.booleans(),
)
def test_vitlab_npz_vitlab_is_exact(act, posemb, img, layout, pool, qkv_bias, norm, named):
    """The same config and bit-identical logits after vitlab -> .npz -> vitlab, whatever the layout cannot say."""
    import tempfile

    import vitlab
    from vitlab.checkpoints.npz_write import write_npz

    fields = dict(act=act, posemb=posemb, img_size=img, pool=pool, class_token=pool == "cls", qkv_bias=qkv_bias)
    if norm:
        fields.update(mean=norm[0], std=norm[1])
    if named:
        fields["class_names"] = ["cat", "dog", "eel"]
    with tempfile.TemporaryDirectory() as d:
        vitlab.save(_roundtrip_model(**fields), Path(d) / "m")
        before = vitlab.load(Path(d) / "m")
        write_npz(before, Path(d) / "m.npz", layout=layout)
        after = vitlab.load(Path(d) / "m.npz")
    assert after.config == before.config
    x = torch.randn(3, 3, img, img, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(after(x), before(x))


def test_convert_to_npz_and_back_keeps_the_model_and_says_what_only_vitlab_reads(tmp_path, capsys):
    import json

    import vitlab

    fields = dict(act="gelu", posemb="none", mean=(0.1, 0.2, 0.3), std=(0.3, 0.2, 0.1), class_names=["a", "b", "c"])
    vitlab.save(_roundtrip_model(**fields), tmp_path / "m")
    assert main(["convert", str(tmp_path / "m"), str(tmp_path / "m.npz"), "--layout", "big_vision"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("note: ")
    assert "act, mean, std, class_names, posemb, img_size have no place in the big_vision layout" in err
    vitlab.save(_roundtrip_model(act="gelu", img_size=224), tmp_path / "one")  # one field: "act has", not "act have"
    assert main(["convert", str(tmp_path / "one"), str(tmp_path / "one.npz")]) == 0
    assert (
        "one.npz: act has no place in the vit_jax layout; it is kept in its vitlab/config array"
        in capsys.readouterr().err
    )
    assert main(["convert", str(tmp_path / "m.npz"), str(tmp_path / "back")]) == 0
    a, b = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("m", "back"))
    assert b["extra"].pop("converted_from") == str(tmp_path / "m.npz")
    assert a == b
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(vitlab.load(tmp_path / "back")(x), vitlab.load(tmp_path / "m")(x))


def _npz_with(path: Path, config) -> None:
    """Rewrite the ``vitlab/config`` array of the .npz ``path``."""
    import json

    import numpy as np

    arrays = dict(np.load(path))
    if isinstance(config, dict):
        arrays["vitlab/config"] = np.frombuffer(json.dumps(config).encode(), dtype=np.uint8)
    else:
        arrays["vitlab/config"] = config
    np.savez(path, **arrays)


@pytest.mark.parametrize(
    "lie, says",
    [
        ({"depth": 3}, "depth is 3 but the weights have 2"),
        ({"num_heads": 4}, "num_heads is 4 but the attention kernels have 2 heads"),
        ({"act": "relu"}, "act: "),
        ({"qkv_bias": False}, "qkv_bias is false but the weights have a non-zero blocks.0.attn.qkv.bias"),
        ("float", "not the UTF-8 bytes of a JSON config"),
        ("garbage", "not a readable config"),
    ],
)
def test_a_lying_stored_config_is_refused_naming_it(tmp_path, lie, says):
    import json

    import numpy as np

    import vitlab
    from vitlab.checkpoints.npz_write import write_npz

    path = tmp_path / "m.npz"
    write_npz(_roundtrip_model(), path)
    config = json.loads(np.load(path)["vitlab/config"].tobytes())
    if lie == "float":
        _npz_with(path, np.zeros(4, np.float32))
    elif lie == "garbage":
        _npz_with(path, np.frombuffer(b"{not json", dtype=np.uint8))
    else:
        _npz_with(path, {**config, **lie})
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    msg = str(e.value)
    assert msg.startswith(f"{path} (vitlab/config): ") and says in msg and "\n" not in msg, msg


def test_npz_refuses_pre_norm_it_cannot_hold(tmp_path):
    from vitlab.checkpoints.npz_write import write_npz
    from vitlab.errors import ConfigError

    with pytest.raises(ConfigError, match="pre_norm: True has no vit_jax .npz layout"):
        write_npz(_roundtrip_model(pre_norm=True), tmp_path / "x.npz")


# -- evaluation memory ------------------------------------------------------------------------------------------

_EVAL_20K = """
import resource, sys, torch
from torch import nn
from vitlab.evaluate.accuracy import evaluate_batches

def vmdata():
    for line in open("/proc/self/status"):
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024

C = 20_000
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(4, C))
batches = [(torch.randn(16, 1, 2, 2), torch.randint(0, C, (16,))) for _ in range(4)]
# allocations beyond 512 MiB more than now fail: the old dense matrix (3.2 GB) and its per-batch copy cannot hide
resource.setrlimit(resource.RLIMIT_DATA, (vmdata() + (512 << 20), resource.getrlimit(resource.RLIMIT_DATA)[1]))
res = evaluate_batches(model, batches, num_classes=C, device=torch.device("cpu"))
cells = res["confusion_cells"]
assert "confusion" not in res and res["count"] == 64 and len(res["per_class"]) == len(res["class_counts"]) == C
assert cells[:, 2].sum() == 64 and sum(res["class_counts"]) == 64
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmData from /proc (Linux)")
def test_evaluation_of_20000_classes_stays_within_a_memory_limit(tmp_path):
    """A classes x classes matrix (and a same-size temporary per batch) is 3.2 GB at 20,000 classes: the
    evaluation runs under an address-space limit of what it had plus 512 MiB."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _EVAL_20K], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def _batches(classes: int, n: int = 5):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(12, 1, 2, 2, generator=g), torch.randint(0, classes, (12,), generator=g)) for _ in range(n)]


def test_sparse_confusion_cells_count_what_the_dense_matrix_counts(monkeypatch):
    """Above the dense cap only the non-zero cells are kept; they and the per-class counts equal the dense
    matrix's, also through the distributed reduction (a process group of one)."""
    import numpy as np

    from vitlab.distributed import setup, teardown
    from vitlab.evaluate import accuracy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 7))
    dense = accuracy.evaluate_batches(model, _batches(7), num_classes=7, device=torch.device("cpu"))
    monkeypatch.setattr(accuracy, "DENSE_CONFUSION_BYTES", 0)
    setup("cpu", group=True)
    try:
        group_of_one = type("D", (), {"enabled": True, "world_size": 1})()
        sparse = accuracy.evaluate_batches(
            model, _batches(7), num_classes=7, device=torch.device("cpu"), dist=group_of_one
        )
    finally:
        teardown()
    rebuilt = np.zeros((7, 7), np.int64)
    for t, p, n in sparse["confusion_cells"]:
        rebuilt[t, p] = n
    assert np.array_equal(rebuilt, dense["confusion"]) and "confusion" not in sparse
    assert sparse["class_counts"] == dense["confusion"].sum(1).tolist()
    for key in ("top1", "top5", "loss", "count", "per_class"):
        assert sparse[key] == dense[key], key


def test_the_confusion_figure_is_drawn_only_when_readable(tmp_path, capsys):
    from vitlab.train.persist.figures import draw_figures

    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1, "train_loss": 1.0, "top1": 0.5, "top5": 0.9, "lr": 0.1}\n')
    draw_figures(tmp_path, [f"c{i}" for i in range(3)], {"per_class": [0.5] * 3, "confusion": torch.eye(3).numpy()})
    assert (tmp_path / "confusion.png").is_file()
    (tmp_path / "confusion.png").unlink()
    names = [f"c{i}" for i in range(150)]
    draw_figures(tmp_path, names, {"per_class": [0.5] * 150, "confusion": torch.eye(150).numpy()})
    err = capsys.readouterr().err
    assert "note: no confusion.png: 150 classes are too many to read in one figure" in err and "warning" not in err
    assert not (tmp_path / "confusion.png").exists() and (tmp_path / "curves.png").is_file()

"""Untrusted files cannot exhaust memory: every read of a checkpoint or config is bounded before it happens.

Zip bombs in ``.npz`` and PyTorch zip checkpoints are refused from the central directory's sizes;
config files that are FIFOs, devices or huge are refused without reading them; a config lying about
the architecture is refused before any of the model is allocated; malformed values are one line
naming the file and the field.
"""

from __future__ import annotations

import io
import json
import os
import threading
import tracemalloc
import zipfile

import numpy as np
import pytest
import torch

import vitlab
import vitlab.checkpoints as ckpts
from vitlab.errors import CheckpointError
from vitlab.models import VisionTransformer, ViTConfig

BOMB = 320 << 20  # over the 256 MiB floor of the default limit; deflates to ~1.5 MB


def _write_zeros(f, n: int) -> None:
    chunk = bytes(4 << 20)
    for _ in range(n // len(chunk)):
        f.write(chunk)


def _npy_header(shape: tuple[int, ...]) -> bytes:
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(b, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return b.getvalue()


def _one_line(e: pytest.ExceptionInfo, *parts: str) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    for part in parts:
        assert part in msg, msg
    return msg


def _tiny(**kw) -> VisionTransformer:
    cfg = {"embed_dim": 8, "depth": 1, "num_heads": 2, "mlp_dim": 16, "img_size": 16, "patch_size": 8}
    return VisionTransformer(ViTConfig(**{**cfg, "num_classes": 3, **kw}))


def test_npz_zip_bomb_is_refused_before_inflating(tmp_path):
    """A ~1.5 MB .npz whose first array inflates to 320 MiB: refused from the central directory."""
    path = tmp_path / "bomb.npz"
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z,
        z.open("embedding/kernel.npy", "w", force_zip64=True) as f,
    ):
        f.write(_npy_header((BOMB // 4,)))
        _write_zeros(f, BOMB)
    assert path.stat().st_size < 4 << 20
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as e:
            vitlab.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _one_line(e, str(path), "'embedding/kernel'", "unpacks to", "VITLAB_MAX_UNPACKED_BYTES")
    assert peak < 32 << 20, f"{peak / 2**20:.0f} MiB allocated while refusing"


def test_npz_header_claiming_more_than_its_member(tmp_path):
    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("embedding/kernel.npy", _npy_header((1 << 40,)) + bytes(64))
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    _one_line(e, str(path), "'embedding/kernel'", "header claims shape")


@pytest.mark.slow
def test_npz_limit_can_be_raised_and_only_needed_arrays_are_read(tmp_path, monkeypatch):
    """Arrays the model does not use (optimizer state) are never inflated, so a bomb there is harmless;
    and ``max_unpacked_bytes`` / the environment variable lower or raise the limit."""
    from test_checkpoints_npz import to_npz

    path = to_npz(_tiny(), tmp_path / "m.npz", layout="vit_jax")
    with (
        zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED, compresslevel=1) as z,
        z.open("opt/state/m.npy", "w", force_zip64=True) as f,
    ):
        f.write(_npy_header((BOMB // 4,)))
        _write_zeros(f, BOMB)
    assert vitlab.load(path).config.depth == 1
    with pytest.raises(CheckpointError, match="over the limit of 1,024 bytes"):
        vitlab.load(path, max_unpacked_bytes=1024)
    monkeypatch.setenv("VITLAB_MAX_UNPACKED_BYTES", "1K")
    with pytest.raises(CheckpointError, match="over the limit of 1,024 bytes"):
        vitlab.load(path)


def test_pth_zip_bomb_is_refused_before_torch_inflates_it(tmp_path, monkeypatch):
    """torch's zip container with its tensor record deflated from 320 MiB of zeros."""
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(4)}, buf)
    path = tmp_path / "bomb.pth"
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for info in zin.infolist():
            if info.filename.endswith("/data/0"):
                with z.open(info.filename, "w", force_zip64=True) as f:
                    _write_zeros(f, BOMB)
            else:
                z.writestr(info.filename, zin.read(info))
    calls = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(a) or real_load(*a, **k))
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    _one_line(e, str(path), "data/0", "unpacks to")
    assert not calls, "torch.load ran on the bomb"


def test_legacy_pickle_claiming_a_huge_storage_is_one_line(tmp_path):
    """Legacy (non-zip) pickles keep their tensors' bytes raw in the file: a storage claiming 8 GB
    is refused by torch from the file's own size, without the memory (a guard, not a fix)."""
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(1000)}, buf, _use_new_zipfile_serialization=False)
    data = buf.getvalue()
    i = data.find(b"M\xe8\x03")  # BININT2 1000, the storage's element count
    path = tmp_path / "legacy.pth"
    path.write_bytes(data[:i] + b"J" + (2**31 - 1).to_bytes(4, "little") + data[i + 3 :])
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    _one_line(e, str(path))


@pytest.fixture
def built(monkeypatch):
    """Devices of every VisionTransformer the loader builds (a lying config must build none off ``meta``)."""
    devices: list[str] = []

    class Spy(VisionTransformer):
        def __init__(self, cfg):
            devices.append(str(torch.empty(0).device))
            super().__init__(cfg)

    monkeypatch.setattr(ckpts, "VisionTransformer", Spy)
    return devices


def _hf_folder(path, **config):
    """A Hugging Face folder holding tiny weights (depth 1, width 8) and the given config."""
    from safetensors.torch import save_file

    path.mkdir()
    sd = _tiny().state_dict()
    hf = {
        "vit.embeddings.cls_token": sd["cls_token"],
        "vit.embeddings.position_embeddings": sd["pos_embed"],
        "vit.embeddings.patch_embeddings.projection.weight": sd["patch_embed.proj.weight"],
        "vit.embeddings.patch_embeddings.projection.bias": sd["patch_embed.proj.bias"],
        "vit.layernorm.weight": sd["norm.weight"],
        "vit.layernorm.bias": sd["norm.bias"],
        "classifier.weight": sd["head.weight"],
        "classifier.bias": sd["head.bias"],
    }
    for name, ours in (
        ("layernorm_before", "norm1"),
        ("layernorm_after", "norm2"),
        ("intermediate.dense", "mlp.fc1"),
        ("output.dense", "mlp.fc2"),
        ("attention.output.dense", "attn.proj"),
    ):
        for kind in ("weight", "bias"):
            hf[f"vit.encoder.layer.0.{name}.{kind}"] = sd[f"blocks.0.{ours}.{kind}"]
    for kind in ("weight", "bias"):
        q, k, v = sd[f"blocks.0.attn.qkv.{kind}"].chunk(3)
        for part, t in (("query", q), ("key", k), ("value", v)):
            hf[f"vit.encoder.layer.0.attention.attention.{part}.{kind}"] = t.contiguous()
    save_file({k: v.contiguous() for k, v in hf.items()}, str(path / "model.safetensors"))
    base = {
        "model_type": "vit",
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "image_size": 16,
        "patch_size": 8,
        "num_channels": 3,
    }
    (path / "config.json").write_text(json.dumps({**base, **config}))
    return path


def test_the_hf_fixture_loads(tmp_path):
    assert vitlab.load(_hf_folder(tmp_path / "hf")).config.depth == 1


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"num_hidden_layers": 10000, "hidden_size": 100000, "intermediate_size": 400000}, "parameters"),
        ({"num_hidden_layers": 1000}, "num_hidden_layers is 1000 but the weights have 1"),
        ({"intermediate_size": 1 << 30}, "intermediate_size"),
        ({"image_size": 100000}, "image_size is (100000, 100000)"),
    ],
)
def test_lying_hf_config_is_refused_before_allocating(tmp_path, built, config, field):
    path = _hf_folder(tmp_path / "hf", **config)
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    _one_line(e, str(path / "config.json"), field)
    assert all(d == "meta" for d in built), built


def test_lying_vitlab_config_is_refused_before_allocating(tmp_path, built):
    path = tmp_path / "m"
    vitlab.save(_tiny(), path)
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, "depth": 1000}))
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    _one_line(e, str(path / "config.json"), "depth is 1000 but the weights have 1")
    (path / "config.json").write_text(json.dumps({**raw, "embed_dim": 100000, "depth": 10000, "mlp_dim": 400000}))
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    _one_line(e, str(path / "config.json"), "over the cap", "VITLAB_MAX_PARAMS")
    assert all(d == "meta" for d in built), built


def test_the_parameter_cap_can_be_raised(tmp_path, monkeypatch):
    path = tmp_path / "m"
    vitlab.save(_tiny(), path)
    with pytest.raises(CheckpointError, match="over the cap of 100"):
        vitlab.load(path, max_params=100)
    monkeypatch.setenv("VITLAB_MAX_PARAMS", "100")
    with pytest.raises(CheckpointError, match="over the cap of 100"):
        vitlab.load(path)
    assert vitlab.load(path, max_params=10**6).config.depth == 1


def _load_with_timeout(path, seconds: float = 20.0):
    """``vitlab.load(path)`` in a thread: its result or exception, or ``TimeoutError`` if it blocks."""
    out: dict = {}

    def run():
        try:
            out["model"] = vitlab.load(path)
        except BaseException as e:  # handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        return TimeoutError(f"vitlab.load({path}) still running after {seconds} s")
    return out.get("error", out.get("model"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_config_json_as_a_fifo_does_not_hang(tmp_path):
    path = _hf_folder(tmp_path / "hf")
    (path / "config.json").unlink()
    os.mkfifo(path / "config.json")
    result = _load_with_timeout(path)
    if isinstance(result, TimeoutError):  # unblock the reader before failing
        fd = os.open(path / "config.json", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    assert isinstance(result, CheckpointError), result
    assert "FIFO" in str(result) and str(path / "config.json") in str(result)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_config_json_linked_to_a_device_or_too_large(tmp_path):
    path = _hf_folder(tmp_path / "hf")
    cfg = path / "config.json"
    cfg.unlink()
    cfg.symlink_to("/dev/zero")
    result = _load_with_timeout(path)
    assert isinstance(result, CheckpointError), result
    assert "a device, not a regular file" in str(result) and str(cfg) in str(result)
    cfg.unlink()
    cfg.write_text(json.dumps({"model_type": "vit", "pad": "x" * (5 << 20)}))
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    _one_line(e, str(cfg), "larger than 4 MiB")


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("depth", "12", "depth: expected an integer, got str '12'"),
        ("depth", [[1]], "depth: expected an integer"),
        ("embed_dim", {"a": 1}, "embed_dim: expected an integer"),
        ("img_size", [[16], 16], "img_size[0]: expected an integer"),
        ("img_size", "16", "img_size: expected an int or a (height, width) pair"),
        ("depth", 10**40, "depth: a 133-bit number is out of range"),
        ("depth", -3, "depth: -3 is out of range [0, 2147483648)"),
        ("patch_size", 0, "patch_size: must be positive"),
        ("qkv_bias", "yes", "qkv_bias: expected true or false"),
        ("mean", [0.5, "x", 0.5], "mean[1]: expected a finite number"),
        ("class_names", [1, 2, 3], "class_names: expected a list of strings"),
        ("extra", [1], "extra: expected an object"),
        ("norm_eps", None, "norm_eps: expected a finite number"),
        ("hybrid_layers", "3,4", "hybrid_layers: expected a list of integers"),
    ],
)
def test_malformed_vitlab_config_values_are_one_line(tmp_path, field, value, expected):
    path = tmp_path / "m"
    vitlab.save(_tiny(), path)
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, field: value}))
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    _one_line(e, f"{path / 'config.json'}: {expected}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[" * 100000 + "]" * 100000, "nested too deeply"),
        ('{"format": "vitlab", "depth": 1' + "0" * 5000 + "}", "not a readable config"),
        ('{"format": "vitlab", "depth": 1e400}', "depth: expected an integer, got float inf"),
        ("[1, 2]", "holds a JSON list"),
        ("\xff\xfe{", "not a readable config"),
    ],
)
def test_unparseable_configs_are_one_line(tmp_path, text, expected):
    path = _hf_folder(tmp_path / "hf")
    (path / "config.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    _one_line(e, str(path / "config.json"), expected)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"hidden_size": "8"}, "hidden_size: expected an integer, got str '8'"),
        ({"num_hidden_layers": [1]}, "num_hidden_layers: expected an integer"),
        ({"image_size": [16, [16]]}, "image_size[1]: expected an integer"),
        ({"layer_norm_eps": "1e-12"}, "layer_norm_eps: expected a finite number"),
        ({"hidden_act": ["gelu"]}, "hidden_act ['gelu'] is not supported"),
        ({"id2label": {"x": 1}}, "id2label: expected an object of class index -> name strings"),
        ({"id2label": {"0": "a", "5": "b"}}, "id2label: the class indices are not 0 .. 1"),
        ({"num_attention_heads": 3}, "num_attention_heads: the width 8 is not divisible by 3 heads"),
    ],
)
def test_malformed_hf_config_values_are_one_line(tmp_path, config, expected):
    path = _hf_folder(tmp_path / "hf", **config)
    with pytest.raises(CheckpointError) as e:
        vitlab.load(path)
    _one_line(e, f"{path / 'config.json'}: {expected}")


def test_malformed_timm_hub_config_is_one_line(tmp_path):
    folder = tmp_path / "snap"
    folder.mkdir()
    torch.save(_tiny().state_dict(), folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({"architecture": "vit_x", "pretrained_cfg": {"mean": 1, "std": 2}}))
    with pytest.raises(CheckpointError) as e:
        vitlab.load(folder)
    _one_line(e, str(folder / "config.json"), "mean: expected a list of 3 numbers")


def test_cli_prints_one_line_for_a_lying_config(tmp_path, capsys):
    from vitlab.cli import main

    path = _hf_folder(tmp_path / "hf", num_hidden_layers=1000)
    assert main(["convert", str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vitlab convert: error: ") and "num_hidden_layers is 1000" in err and "\n" not in err

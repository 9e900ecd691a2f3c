"""`vitlab export` as a deployable folder (src/vitlab/deploy/): each export path (ONNX float / int8 dynamic /
int8 static, torch int8, TorchScript int8, token merging), the ONNX file that works alone, the agreement
report and its non-zero exit, and `vitlab predict` / `vitlab eval` serving the folder with the labels the
report states. Tiny models (32 px, patch 8, width 32, depth 2) trained for a few steps on a generated
ImageFolder, so int8 agreement is measured on a model with real margins."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_close_rel
from imagefolder import tiny_folder
from vitlab.checkpoints import save
from vitlab.cli import main
from vitlab.data.images.user_files import image_files, read_image
from vitlab.deploy import ExportOptions, export_folder, open_exported, read_export
from vitlab.evaluate import model_inputs
from vitlab.export import ExportError, export_model, load_exported, run_exported
from vitlab.models import VisionTransformer

pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_dim=64)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("deploy") / "colours", per_class=16, test_per_class=4, size=32)


@pytest.fixture(scope="module")
def trained(data) -> VisionTransformer:
    """A tiny ViT fitted for 60 full-batch Adam steps to the colour classes of ``data/train``."""
    torch.manual_seed(0)
    files = image_files([data / "train"])
    model = VisionTransformer(**TINY, num_classes=3, class_names=["class0", "class1", "class2"])
    x = model_inputs(model, [read_image(f) for f in files])
    y = torch.tensor([int(f.parent.name[-1]) for f in files])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def model_dir(trained, tmp_path_factory) -> Path:
    return save(trained, tmp_path_factory.mktemp("deploy") / "model")


CASES = [
    ("onnx", None, 0),
    ("onnx", "dynamic", 0),
    ("onnx", "static", 0),
    ("torch", "dynamic", 0),
    ("torchscript", "dynamic", 0),
    ("onnx", None, 2),
    ("torch", "dynamic", 2),
]


@pytest.mark.parametrize(
    ("fmt", "int8", "r"),
    [pytest.param(*c, marks=pytest.mark.slow) if c[0] == "onnx" else c for c in CASES],  # an ONNX export: seconds
    ids=[f"{f}-{i or 'fp32'}-tome{r}" for f, i, r in CASES],
)
def test_export_paths(fmt, int8, r, trained, data, tmp_path, monkeypatch):
    import vitlab.deploy.pipeline

    # int8 measured faster at every batch size (the float32 model is then not kept: test_reliability_exports.py
    # tests the other outcomes of the measurement)
    monkeypatch.setattr(vitlab.deploy.pipeline, "serving_table", lambda timing: None)
    opts = ExportOptions(
        format=fmt,
        int8=int8,
        tome=r,
        check_data=str(data),
        calib_data=str(data / "train") if int8 == "static" else None,
        timing_runs=2 if fmt == "onnx" and int8 == "dynamic" else 0,
    )
    rep = export_folder(trained, tmp_path / "out", opts, source="tiny", command="vitlab export ...")
    model_file = {"onnx": "model.onnx", "torch": "model.safetensors", "torchscript": "model.pt"}[fmt]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        [model_file, "config.json", "export_report.json"]
    )  # one model file, no external data, no staging left behind
    raw = json.loads((tmp_path / "out" / "config.json").read_text())
    assert raw["export"]["format"] == fmt and raw["export"]["int8"] == int8 and raw["export"]["tome_r"] == r
    assert raw["mean"] == list(trained.config.mean) and raw["class_names"] == trained.config.class_names
    pre = raw["pretrained_cfg"]
    assert pre["input_size"] == [3, 32, 32] and pre["interpolation"] == "bicubic" and pre["crop_pct"] == 1.0
    assert pre["label_names"] == ["class0", "class1", "class2"]

    on_disk = json.loads((tmp_path / "out" / "export_report.json").read_text())
    assert on_disk["passed"] == rep["passed"] and on_disk["command"] == "vitlab export ..."
    ag = rep["agreement"]
    assert ag["images"] == 12 and len(ag["predictions"]) == 12
    assert rep["passed"] and ag["top1_agreement"] >= 0.99
    assert ag["logit_cosine_mean"] > (0.999 if int8 is None and r == 0 else 0.95)
    assert ag["top1"]["fp32"] == 1.0  # (a model that learned the colours: the check has real margins)
    if int8 and fmt != "torchscript":  # (a TorchScript file also holds its code: larger than a tiny model)
        assert rep["size_bytes"]["exported"] < rep["size_bytes"]["fp32"]
    if r:
        assert rep["tome"]["schedule"] == [2, 2] and rep["tome"]["macs_tome"] < rep["tome"]["macs_fp32"]
    if rep["timing"]:
        for side in ("fp32", "exported"):
            assert rep["timing"][side]["latency_ms_batch1"] > 0 and rep["timing"][side]["images_per_s_batch32"] > 0


@pytest.mark.slow
def test_onnx_file_runs_alone(trained, tmp_path):
    """The ONNX file copied alone runs: the weights are inside it (they were in model.onnx.data before)."""
    import onnxruntime as ort

    (tmp_path / "a").mkdir()
    res = export_model(trained, tmp_path / "a", format="onnx")
    assert res.files == [tmp_path / "a" / "model.onnx"]
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["model.onnx"]
    import onnx

    assert not any(n.metadata_props for n in onnx.load(str(res.path)).graph.node)  # no stack traces, no paths
    (tmp_path / "b").mkdir()
    shutil.copy(res.path, tmp_path / "b" / "model.onnx")
    sess = ort.InferenceSession(str(tmp_path / "b" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert_close_rel(run_exported(sess, x.numpy()), trained(x).numpy())


@pytest.mark.slow
def test_external_data_only_past_the_limit_and_named(trained, tmp_path, monkeypatch, capsys):
    import vitlab.deploy.model_file

    monkeypatch.setattr(vitlab.deploy.model_file, "ONNX_SINGLE_FILE_BYTES", 0)  # every model is "past 2 GiB"
    res = export_model(trained, tmp_path / "m.onnx", format="onnx")
    assert res.files == [tmp_path / "m.onnx", tmp_path / "m.onnx.data"] and all(f.is_file() for f in res.files)
    save(trained, tmp_path / "model")
    assert main(["export", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "x.onnx")]) == 0
    assert "x.onnx.data" in capsys.readouterr().out  # named in the output
    rep = export_folder(trained, tmp_path / "folder", ExportOptions(timing_runs=0))
    assert read_export(tmp_path / "folder")[1].external_data and "model.onnx.data" in rep["files"]


@pytest.mark.slow
def test_token_merging_in_the_onnx_graph(trained, tmp_path):
    """ToMe recorded by the exporter: the ONNX model merges as the eager model does, at any batch size."""
    import copy

    merged = copy.deepcopy(trained).set_tome(3)
    res = export_model(merged, tmp_path, format="onnx")
    sess = load_exported(res.path)
    for b in (1, 4):
        x = torch.randn(b, 3, 32, 32, generator=torch.Generator().manual_seed(b))
        with torch.no_grad():
            want = merged(x).numpy()
        assert_close_rel(run_exported(sess, x.numpy()), want)
        assert not np.allclose(want, trained(x).detach().numpy(), atol=1e-3)  # (merging did happen)


@pytest.mark.slow
def test_failed_agreement_exits_nonzero(model_dir, data, tmp_path, monkeypatch, capsys):
    """A broken quantiser (its head's classes rolled) is caught by the agreement check: last line, exit 1."""
    import vitlab.deploy.quantize as q

    real = q.torch_dynamic

    def broken(model):
        m = real(model)
        m.head = torch.nn.Linear(m.head.in_features, m.head.out_features)  # a head that lost its weights
        torch.nn.init.normal_(m.head.weight, std=5.0)
        return m

    monkeypatch.setattr(q, "torch_dynamic", broken)
    out = tmp_path / "broken"
    argv = ["export", "--model", str(model_dir), "--format", "torch", "--int8", "dynamic", "--check-data", str(data)]
    assert main([*argv, "--out", str(out), "--no-timing"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("FAILED:") and "--max-disagreement 1%" in lines[-1]
    assert json.loads((out / "export_report.json").read_text())["passed"] is False
    monkeypatch.setattr(q, "torch_dynamic", real)
    assert main([*argv, "--out", str(out), "--no-timing", "--overwrite"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("passed:")


def _predicted(argv: list[str], capsys) -> dict[str, str]:
    assert main([*argv, "--json"]) == 0
    return {r["image"]: r["top"][0]["class"] for r in json.loads(capsys.readouterr().out)}


@pytest.mark.slow
def test_predict_gives_the_labels_of_the_report(model_dir, data, tmp_path, capsys):
    out = tmp_path / "int8"
    argv = ["export", "--model", str(model_dir), "--int8", "dynamic", "--check-data", str(data), "--out", str(out)]
    assert main([*argv, "--no-timing"]) == 0
    capsys.readouterr()
    rep = json.loads((out / "export_report.json").read_text())
    test_images = str(data / "test")
    served = _predicted(["predict", "--model", str(out), test_images], capsys)
    original = _predicted(["predict", "--model", str(model_dir), test_images], capsys)
    assert served == {p["image"]: p["exported"] for p in rep["agreement"]["predictions"]}
    assert original == {p["image"]: p["fp32"] for p in rep["agreement"]["predictions"]}
    assert main(["eval", "--model", str(out), "--data", str(data), "--cache-dir", str(tmp_path / "cache")]) == 0
    assert json.loads((out / "eval.json").read_text())["top1"] == rep["agreement"]["top1"]["exported"]


def test_torchscript_runs_only_when_trusted(model_dir, data, tmp_path, capsys):
    out = tmp_path / "ts"
    assert main(["export", "--model", str(model_dir), "--format", "torchscript", "--out", str(out), "--no-timing"]) == 0
    capsys.readouterr()
    img = str(data / "test" / "class0")
    assert main(["predict", "--model", str(out), img]) == 2
    assert "--trust-torchscript" in capsys.readouterr().err
    assert main(["predict", "--model", str(out), img, "--trust-torchscript"]) == 0
    with pytest.raises(ExportError, match="only when asked by name"):
        load_exported(out / "model.pt")  # never chosen from a file name
    with pytest.raises(Exception, match="trust"):
        open_exported(out)


@pytest.mark.slow
def test_tome_flags(model_dir, data, tmp_path, capsys):
    out = tmp_path / "tome"
    argv = ["export", "--model", str(model_dir), "--tome", "2", "--check-data", str(data), "--out", str(out)]
    assert main([*argv, "--no-timing"]) == 0
    img = str(data / "test" / "class1")
    assert main(["predict", "--model", str(out), img, "--tome", "3"]) == 2
    assert "exported with --tome 2" in capsys.readouterr().err
    assert main(["predict", "--model", str(out), img, "--tome", "2"]) == 0
    assert main(["predict", "--model", str(model_dir), img, "--tome", "2"]) == 0


def test_torchscript_without_deprecation_noise(trained, tmp_path):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = export_model(trained, tmp_path / "m.pt", format="torchscript")
        load_exported(res.path, format="torchscript")
    noise = [str(w.message) for w in seen if "jit" in str(w.message) or issubclass(w.category, torch.jit.TracerWarning)]
    assert not noise


def test_generated_images_said_so(trained, tmp_path):
    rep = export_folder(trained, tmp_path / "o", ExportOptions(format="torch", timing_runs=0))
    assert rep["check_data"]["source"] == "generated" and "generated images" in rep["check_data"]["description"]
    assert rep["agreement"]["top1"] is None and rep["agreement"]["top1_agreement"] == 1.0


def test_refusals(model_dir, data, tmp_path, capsys):
    base = ["export", "--model", str(model_dir)]
    for argv, says in [
        ([*base, "--int8", "static", "--out", str(tmp_path / "s")], "--calib-data"),
        ([*base, "--format", "torch", "--int8", "static", "--calib-data", str(data)], "--format onnx"),
        ([*base, "--int8", "dynamic", "--out", str(tmp_path / "one.onnx")], "single file"),
        ([*base, "--out", str(model_dir)], "input model"),
        ([*base, "--max-disagreement", "lots"], "--max-disagreement"),
        ([*base, "--check-data", str(tmp_path / "nowhere")], "--check-data"),
        (["inspect", "--model", str(tmp_path / "s0")], "predict and eval"),
    ]:
        if argv[0] == "inspect":
            export_folder(VisionTransformer(**TINY), tmp_path / "s0", ExportOptions(format="torch", timing_runs=0))
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("vitlab ") and says in err and len(err.strip().splitlines()) == 1, err
    assert main([*base, "--format", "torch", "--out", str(tmp_path / "s0"), "--no-timing"]) == 2  # exists
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_deploy_smoke(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_deploy.py"), "--smoke", "--out", str(tmp_path / "b.json")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    names = {r["row"] for r in rows}
    assert {"timm eager fp32", "vitlab eager fp32", "ORT fp32", "ORT int8 dynamic", "ORT int8 static"} <= names
    assert "torch int8 dynamic" in names and {r["tome_r"] for r in rows} == {0, 1, 2}
    assert all(0.0 <= r["top1_agreement"] <= 1.0 for r in rows)

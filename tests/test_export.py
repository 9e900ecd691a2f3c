"""`vitlab export`: ONNX (onnxruntime) and TorchScript with a dynamic batch, parity with PyTorch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import F32_RTOL, assert_close_rel
from vitlab.cli import main
from vitlab.export import ExportError, export_model, load_exported, run_exported
from vitlab.models import create_model

TINY = dict(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, mlp_dim=64, num_classes=5)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = create_model("vit_ti16", **TINY).eval()
    torch.nn.init.normal_(m.head.weight, std=0.5)  # the head is zero-initialised: make the logits informative
    return m


def test_torchscript_dynamic_batch(tmp_path: Path) -> None:
    m = _model()
    res = export_model(m, tmp_path / "m.pt", format="torchscript")
    ts = load_exported(res.path, format="torchscript")  # (TorchScript runs code: loaded only by name)
    x = torch.randn(7, 3, 16, 16)
    got = run_exported(ts, x.numpy())
    with torch.no_grad():
        want = m(x).numpy()
    assert got.shape == (7, 5)
    assert_close_rel(got, want)
    assert np.abs(want).max() > 0.1  # the comparison is not between zeros
    # export's own check (another batch of the same model, so logits of the same size) passed and was reported
    assert res.max_abs_diff is not None and res.max_abs_diff <= F32_RTOL * np.abs(want).max()


@pytest.mark.slow
def test_onnx_dynamic_batch(tmp_path: Path) -> None:
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    m = _model()
    res = export_model(m, tmp_path, format="onnx")
    assert res.path == tmp_path / "model.onnx" and res.path.stat().st_size > 0
    sess = load_exported(res.path)
    assert sess.get_inputs()[0].name == "pixel_values"
    for b in (1, 4):
        x = torch.randn(b, 3, 16, 16)
        with torch.no_grad():
            want = m(x).numpy()
        got = run_exported(sess, x.numpy())
        assert got.shape == (b, 5)
        assert_close_rel(got, want)


def test_bad_format(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="format"):
        export_model(_model(), tmp_path / "m.x", format="tflite")


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny.pt"
    from vitlab.checkpoints import save

    save(_model(), tmp_path / "ckpt")
    assert main(["export", "--model", str(tmp_path / "ckpt"), "--format", "torchscript", "--out", str(out)]) == 0
    assert out.exists() and "max |diff|" in capsys.readouterr().out
    assert main(["export", "--model", str(tmp_path / "missing"), "--format", "torchscript"]) == 2
    assert capsys.readouterr().err.startswith("vitlab export: error:")

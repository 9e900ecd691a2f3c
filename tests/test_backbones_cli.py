"""The commands on the backbones of issue 58 (DINOv3, EVA-02, the Perception Encoder), tiny models: ``vitlab export``
to ONNX (float parity, dynamic batch, int8 with its agreement report) through their RoPE, ``vitlab inspect`` and
``vitlab finetune --init``; and a public timm name found offline in vitlab's download folder."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

import vitlab
from conftest import assert_close_rel
from vitlab.cli import main

pytest.importorskip("onnxruntime")
timm = pytest.importorskip("timm")

# name -> timm's create_model arguments of a tiny random model of the family
TINY = {
    "vit_small_patch16_dinov3_qkvb": dict(depth=1, embed_dim=64, num_heads=4, mlp_ratio=2, img_size=32),
    "eva02_base_patch14_224": dict(depth=1, embed_dim=64, num_heads=4, img_size=28),
    "vit_pe_core_tiny_patch16_384": dict(depth=1, embed_dim=64, num_heads=4, img_size=32),
}


def tiny_folder(name: str, path) -> tuple[torch.nn.Module, str]:
    """timm's tiny model of the family, random, and the vitlab folder of it (loaded from timm's state dict)."""
    kw = TINY[name]
    torch.manual_seed(0)
    ref = timm.create_model(name, pretrained=False, num_classes=3, **kw).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    with (
        pytest.warns(UserWarning) if name.startswith("vit_pe") else contextlib.nullcontext()
    ):  # (a width PE core has not)
        model = vitlab.load(dict(ref.state_dict()), num_heads=kw["num_heads"], img_size=kw["img_size"])
    vitlab.save(model, path)
    return ref, str(path)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TINY))
def test_export_onnx_int8_with_its_agreement_report(name, tmp_path):
    _, folder = tiny_folder(name, tmp_path / "model")
    out = tmp_path / "deploy"
    args = ["export", "--model", folder, "--int8", "dynamic", "--out", str(out), "--no-timing"]
    assert main([*args, "--max-disagreement", "25%"]) == 0  # (random weights: near ties flip under int8)
    report = json.loads((out / "export_report.json").read_text())
    assert report["agreement"]["top1_agreement"] >= 0.75 and report["format"] == "onnx"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit_small_patch16_dinov3_qkvb"])
def test_rope_models_export_to_onnx_with_a_dynamic_batch(name, tmp_path):
    """RoPE's tables are computed in the graph from the patch grid: the ONNX model gives timm's logits at any
    batch size (the float parity of every family is checked by the export above)."""
    import onnxruntime as ort

    from vitlab.export import export_model

    ref, folder = tiny_folder(name, tmp_path / "model")
    model = vitlab.load(folder)
    path = export_model(model, tmp_path / "m.onnx", format="onnx").path
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    s = TINY[name]["img_size"]
    for batch in (1, 5):
        x = torch.randn(batch, 3, s, s, generator=torch.Generator().manual_seed(batch))
        (got,) = session.run(None, {"pixel_values": x.numpy()})
        with torch.no_grad():
            assert_close_rel(torch.from_numpy(got), ref(x), rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit_pe_core_tiny_patch16_384"])
def test_inspect_runs_on_the_family(name, tmp_path, capsys):
    """(PE core: RoPE, a learned table, pooling of every token; DINOv3 has no table to draw)"""
    _, folder = tiny_folder(name, tmp_path / "model")
    args = ["inspect", "--model", folder, "--data", "digits", "--num-images", "4", "--show", "2"]
    assert main([*args, "--img-size", "32", "--out", str(tmp_path / "inspect"), "--json"]) == 0
    (tmp_path / "inspect" / "report.html").stat()
    assert "mean_attention_distance" in capsys.readouterr().out


@pytest.mark.slow
def test_finetune_init_from_a_dinov3_folder(tmp_path, capsys):
    _, folder = tiny_folder("vit_small_patch16_dinov3_qkvb", tmp_path / "model")
    out = tmp_path / "run"
    args = ["finetune", "--init", folder, "--data", "digits", "--img-size", "32", "--epochs", "1", "--batch-size", "32"]
    assert main([*args, "--stop-after", "2", "--out", str(out), "--no-progress"]) == 0
    said = capsys.readouterr()
    assert "no learned position table (2-D RoPE on the 2x2 grid)" in said.out + said.err
    assert (out / "last.pt").exists()


def test_a_timm_hub_name_loads_offline_from_vitlabs_download_folder(tmp_path, monkeypatch):
    """`vitlab finetune --init timm/vit_small_patch16_dinov3.lvd1689m` downloads timm's files online; offline, the
    files put in $VITLAB_CACHE/hub/timm--<repo>/ are used (as for every public name), and timm's config.json there
    names the architecture: DINOv3's RoPE, eps and pooling come from it."""
    from safetensors.torch import save_file

    from vitlab.checkpoints.hub import pretrained_name

    assert pretrained_name("vit_small_patch16_dinov3") == "timm/vit_small_patch16_dinov3.lvd1689m"
    assert pretrained_name("eva02_tiny_patch14_224") == "timm/eva02_tiny_patch14_224.mim_in22k"
    ref = timm.create_model("vit_small_patch16_dinov3", pretrained=False, depth=1, img_size=32).eval()
    folder = tmp_path / "hub" / "timm--vit_small_patch16_dinov3.lvd1689m"
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(folder / "model.safetensors"))
    config = {"architecture": "vit_small_patch16_dinov3", "num_classes": 0, "global_pool": "avg"}
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = vitlab.load("timm/vit_small_patch16_dinov3.lvd1689m")
    assert (model.config.rope_kind, model.config.pool, model.config.norm_eps) == ("dinov3", "gap", 1e-5)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_close_rel(model(x), ref(x))

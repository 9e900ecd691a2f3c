"""vitlab folders round-trip exactly; loads report bad keys by name; bad files give one-line errors."""

from __future__ import annotations

import pickle
import re

import pytest
import torch
from safetensors.torch import save_file

import vitlab
import vitlab.accel
from conftest import assert_close_rel
from vitlab.cli import main

NAMES = ["zero", "one", "two", "three", "four"]


def tiny(seed: int = 0, **kw) -> vitlab.VisionTransformer:
    cfg = dict(img_size=32, patch_size=8, embed_dim=64, depth=4, num_heads=4, mlp_dim=128, num_classes=5)
    torch.manual_seed(seed)
    model = vitlab.VisionTransformer(vitlab.ViTConfig(**{**cfg, **kw}))
    with torch.no_grad():
        model.head.weight.normal_()  # non-zero head
        model.head.bias.normal_()
    return model.eval()


def images(size: int = 32) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))


def test_round_trip_is_exact(tmp_path):
    model = tiny(
        class_names=NAMES, mean=(0.1, 0.2, 0.3), std=(0.3, 0.2, 0.1), act="gelu_tanh", norm_eps=1e-5, extra={"run": "x"}
    )
    vitlab.save(model, tmp_path / "m")
    back = vitlab.load(tmp_path / "m")
    assert back.config == model.config
    assert back.config.class_names == NAMES and back.config.mean == (0.1, 0.2, 0.3)
    with torch.no_grad():
        assert torch.equal(back(images()), vitlab.accel.accelerate(model)(images()))
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize(
    "kw",
    [
        {"pool": "gap", "class_token": False, "fc_norm": True, "head": "mlp", "representation_size": 32},
        {"posemb": "learn2d", "attention": "axial"},
        {"hybrid_layers": (1,), "patch_size": 1, "depth": 1},
    ],
)
def test_round_trip_other_architectures(tmp_path, kw):
    model = tiny(**kw)
    vitlab.save(model, tmp_path / "m")
    back = vitlab.load(tmp_path / "m")
    assert back.config == model.config
    with torch.no_grad():
        assert torch.equal(back(images()), vitlab.accel.accelerate(model)(images()))


def test_other_architecture_names_the_keys(tmp_path):
    vitlab.save(tiny(), tmp_path / "m")
    with pytest.raises(vitlab.CheckpointError, match=r"unexpected blocks\.2\.\*, blocks\.3\.\* \(24 tensors\)"):
        vitlab.load(tmp_path / "m", depth=2)
    with pytest.raises(
        vitlab.CheckpointError, match=r"mis-shaped .*blocks\.0\.mlp\.fc1\.weight \(128, 64\) vs model \(256, 64\)"
    ):
        vitlab.load(tmp_path / "m", mlp_dim=256)
    with pytest.raises(vitlab.CheckpointError, match=r"missing blocks\.4\."):
        vitlab.load(tmp_path / "m", depth=6)


def test_not_strict_warns_and_loads_the_rest(tmp_path):
    model = tiny()
    vitlab.save(model, tmp_path / "m")
    with pytest.warns(UserWarning, match=r"unexpected blocks\.2\."):
        small = vitlab.load(tmp_path / "m", depth=2, strict=False)
    assert torch.equal(small.blocks[1].attn.qkv.weight, model.blocks[1].attn.qkv.weight)


def test_new_num_classes_is_not_an_error(tmp_path):
    vitlab.save(tiny(class_names=NAMES), tmp_path / "m")
    ft = vitlab.load(tmp_path / "m", num_classes=3)
    assert ft.config.num_classes == 3 and ft.config.class_names is None
    assert torch.all(ft.head.weight == 0) and torch.all(ft.head.bias == 0)
    assert vitlab.load(tmp_path / "m", num_classes=0).head.__class__.__name__ == "Identity"


def test_native_at_another_img_size(tmp_path):
    model = tiny()
    vitlab.save(model, tmp_path / "m")
    big = vitlab.load(tmp_path / "m", img_size=64)
    want = vitlab.resample_posemb(model.pos_embed.detach(), (8, 8), mode="bicubic")
    assert torch.allclose(big.pos_embed, want)
    assert big(images(64)).shape == (2, 5)


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("notes.pth", b"hello, this is text\n", "not a PyTorch checkpoint"),
        ("random.pth", bytes(range(256)) * 40, "not a PyTorch checkpoint"),
        ("text.safetensors", b"just some text, not tensors", "not a readable safetensors"),
        ("random.npz", b"PK\x03\x04garbage" * 50, "not a readable .npz"),
    ],
)
def test_files_that_are_not_checkpoints(tmp_path, name, content, match):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(vitlab.CheckpointError, match=match) as e:
        vitlab.load(tmp_path / name)
    assert "\n" not in str(e.value)


def test_state_dict_of_another_network(tmp_path):
    resnet = {
        "conv1.weight": torch.zeros(64, 3, 7, 7),
        "bn1.weight": torch.ones(64),
        "fc.weight": torch.zeros(1000, 512),
    }
    torch.save(resnet, tmp_path / "resnet.pth")
    with pytest.raises(vitlab.CheckpointError, match=r"not a ViT checkpoint.*conv1\.weight"):
        vitlab.load(tmp_path / "resnet.pth")
    torch.save({"epoch": 3, "lr": 0.1}, tmp_path / "meta.pth")
    with pytest.raises(vitlab.CheckpointError, match="holds no tensors"):
        vitlab.load(tmp_path / "meta.pth")
    with pytest.raises(vitlab.CheckpointError, match="no such file"):
        vitlab.load(tmp_path / "missing.pth")


class _Payload:
    """Unpickling this would create a file: the classic malicious-checkpoint trick."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_malicious_pickle_is_never_run(tmp_path):
    target = tmp_path / "pwned.txt"
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        pickle.dump({"patch_embed.proj.weight": _Payload(str(target))}, f, protocol=2)
    torch.save({"state_dict": {"x": torch.zeros(1)}, "hook": _Payload(str(target))}, tmp_path / "evil2.pth")
    assert not target.exists()
    for p in (path, tmp_path / "evil2.pth"):
        with pytest.raises(vitlab.CheckpointError, match=r"refused to unpickle: the file holds a \S*open object"):
            vitlab.load(p)
    assert not target.exists()


@pytest.mark.slow
def test_convert_cli(tmp_path, capsys):
    timm_vit = pytest.importorskip("timm.models.vision_transformer")
    ref = timm_vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=192, depth=2, num_heads=3, num_classes=4
    ).eval()
    with torch.no_grad():
        ref.head.weight.normal_()
    save_file(ref.state_dict(), str(tmp_path / "timm.safetensors"))
    assert main(["convert", str(tmp_path / "timm.safetensors"), str(tmp_path / "out")]) == 0
    assert re.search(r"wrote .*out \(vit_custom: 2 layers, width 192, [\d,]+ params\)", capsys.readouterr().out)
    model = vitlab.load(tmp_path / "out")
    assert model.config.extra["converted_from"].endswith("timm.safetensors")
    with torch.no_grad():
        assert_close_rel(model(images()), ref(images()))

    assert (
        main(
            [
                "convert",
                str(tmp_path / "timm.safetensors"),
                str(tmp_path / "ft"),
                "--num-classes",
                "10",
                "--img-size",
                "64",
            ]
        )
        == 0
    )
    ft = vitlab.load(tmp_path / "ft")
    assert (ft.config.num_classes, ft.config.img_size, ft.pos_embed.shape[1]) == (10, (64, 64), 65)

    (tmp_path / "bad.pth").write_text("not a checkpoint")
    assert main(["convert", str(tmp_path / "bad.pth"), str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitlab convert: error:") and "not a PyTorch checkpoint" in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_fields_of_a_newer_vitlab_are_named_in_a_warning_and_kept(tmp_path):
    """A folder written by a newer vitlab may carry a field this version does not know (one that changes what the
    model computes, and holds no weights to fail the load): before, it was dropped into ``extra`` without a word.
    A field an older vitlab wrote and this one retired stays silent."""
    import json
    import warnings

    from vitlab._version import __version__

    vitlab.save(tiny(), tmp_path / "m")
    cfg_file = tmp_path / "m" / "config.json"
    raw = json.loads(cfg_file.read_text())
    newer = ".".join(str(int(p) + 1) for p in __version__.split("."))
    cfg_file.write_text(json.dumps({**raw, "vitlab_version": newer, "post_norm": True}))
    with pytest.warns(UserWarning, match=rf"written by vitlab {newer}, whose field\(s\) 'post_norm' this vitlab"):
        model = vitlab.load(tmp_path / "m")
    assert model.config.extra["post_norm"] is True  # kept, and saved again as it came
    cfg_file.write_text(json.dumps({**raw, "vitlab_version": "0.0.1", "retired_field": 1}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vitlab.load(tmp_path / "m")

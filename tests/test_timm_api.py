"""timm's model API: the calls a timm user makes give the same answers on a vitlab model as on timm's
(built random-initialised here, weights copied into vitlab by name), and vitlab's own entry points
accept what a timm user types."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import vitlab
from conftest import assert_close_rel
from vitlab import accel
from vitlab.errors import CheckpointError, ConfigError, OfflineError, UnknownModelError

timm = pytest.importorskip("timm")

ARCH = dict(num_classes=5, img_size=32, depth=2)


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("weight") and p.ndim == 1 else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def images(n: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def both() -> tuple[nn.Module, nn.Module]:
    """(timm's model, vitlab's) by the same timm name and keyword arguments, the same weights."""
    ref = randomize(timm.create_model("vit_tiny_patch16_224", pretrained=False, **ARCH))
    ours = vitlab.create_model("vit_tiny_patch16_224", pretrained=False, **ARCH)
    ours.load_state_dict(ref.state_dict())
    return ref, ours.eval()


def test_checklist_attributes_and_forward(both):
    ref, ours = both
    x = images()
    for attr in ("num_features", "embed_dim", "head_hidden_size", "num_classes", "global_pool", "num_prefix_tokens"):
        assert getattr(ours, attr) == getattr(ref, attr), attr
    assert isinstance(ours.get_classifier(), nn.Linear) and ours.get_classifier().out_features == 5
    assert ours.no_weight_decay() <= ref.no_weight_decay()
    assert ours.group_matcher() is not None and set(ours.group_matcher()) == set(ref.group_matcher())
    with torch.no_grad():
        assert_close_rel(ours(x), ref(x))
        feats, want = ours.forward_features(x), ref.forward_features(x)
        assert_close_rel(feats, want)
        assert_close_rel(ours.forward_head(feats, pre_logits=True), ref.forward_head(want, pre_logits=True))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 1},
        {"n": 2, "norm": True},
        {"n": [0], "reshape": True},
        {"n": (0, 1), "return_prefix_tokens": True, "norm": True},
    ],
)
def test_checklist_get_intermediate_layers(both, kwargs):
    ref, ours = both
    with torch.no_grad():
        got, want = ours.get_intermediate_layers(images(), **kwargs), ref.get_intermediate_layers(images(), **kwargs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for a, b in zip(g, w) if kwargs.get("return_prefix_tokens") else [(g, w)]:
            assert a.shape == b.shape
            assert_close_rel(a, b)


@pytest.mark.parametrize(("classes", "pool"), [(3, None), (0, None), (4, "avg"), (0, "avg"), (2, "token")])
def test_checklist_reset_classifier(both, classes, pool):
    ref, ours = both
    ref.reset_classifier(classes, pool)
    ours.reset_classifier(classes, pool)
    assert (ours.num_classes, ours.global_pool) == (ref.num_classes, ref.global_pool)
    assert type(ours.get_classifier()) is type(ref.get_classifier())
    x = images()
    with torch.no_grad():
        got, want = ours(x), ref(x)
    assert got.shape == want.shape == (2, classes or 192)
    if classes == 0:  # no classifier: both return the pooled features
        assert_close_rel(got, want)
    else:  # a fresh zero head
        assert torch.all(got == 0)


def test_reset_classifier_refuses_unknown_pooling(both):
    with pytest.raises(ConfigError, match="global_pool"):
        both[1].reset_classifier(3, "avgmax")


def test_checklist_layer_decay_groups_are_timms(both):
    """timm's optimiser factory reads group_matcher / no_weight_decay: the groups come out the same."""
    from timm.optim._param_groups import param_groups_layer_decay

    def groups(model: nn.Module) -> list[tuple[float, float, list[str]]]:
        names = {id(p): n for n, p in model.named_parameters()}
        nwd = model.no_weight_decay()
        out = param_groups_layer_decay(model, weight_decay=0.05, no_weight_decay_list=nwd, layer_decay=0.5)
        return sorted((g["lr_scale"], g["weight_decay"], sorted(names[id(p)] for p in g["params"])) for g in out)

    ref, ours = both
    assert groups(ours) == groups(ref)
    assert len(groups(ours)) > 4  # depth-wise groups, not one


@pytest.mark.slow
def test_grad_checkpointing_same_gradients():
    """set_grad_checkpointing recomputes blocks in backward (fast and plain models): same gradients."""
    plain = randomize(vitlab.models.create_model("vit_ti16", **ARCH))
    fast = accel.accelerate(copy.deepcopy(plain))
    x = images(4)

    def grads(model: nn.Module, checkpointed: bool) -> dict[str, torch.Tensor]:
        model.zero_grad()
        model.train().set_grad_checkpointing(checkpointed)
        model(x).square().sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    want = grads(plain, False)
    for model in (plain, fast):
        got = grads(model, True)
        for n in want:
            assert_close_rel(got[n], want[n], msg=n)
    assert fast.grad_checkpointing and not fast.cls_only_applies()


def test_grad_checkpointing_uses_torch_checkpoint(monkeypatch):
    import vitlab.models.vit as vit_module

    calls = []
    real = vit_module.checkpoint
    monkeypatch.setattr(vit_module, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = vitlab.create_model("vit_ti16", **ARCH).train()
    model.set_grad_checkpointing()
    model(images()).sum().backward()
    assert len(calls) == 2
    with torch.no_grad():  # not in inference
        model.eval()(images())
    assert len(calls) == 2


def test_positional_forward_for_the_legacy_onnx_exporter():
    """TorchScript-based ONNX export appends defaulted parameters positionally (forward(x, False))."""
    from torch.onnx._internal.torchscript_exporter.utils import _decide_input_format

    model = vitlab.create_model("vit_ti16", **ARCH).eval()
    x = images()
    args = _decide_input_format(model, (x,))
    with torch.no_grad():
        assert_close_rel(model(*args), model(x))
        traced = torch.jit.trace(model, (x,))
        assert_close_rel(traced(x), model(x))


def test_onnx_export_legacy(tmp_path):
    pytest.importorskip("onnx")
    model = vitlab.create_model("vit_ti16", **ARCH).eval()
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (images(),), str(path), dynamo=False)
    assert path.stat().st_size > 0


def test_public_namespace():
    names = dir(vitlab)
    assert {"create_model", "load", "save", "VisionTransformer"} <= set(names)
    assert not {"Any", "importlib", "annotations", "os", "TYPE_CHECKING"} & set(names)
    assert sorted(vitlab.__all__) == names


@pytest.mark.parametrize(
    ("name", "canon", "size", "mean"),
    [
        ("vit_base_patch16_224", "vit_b16", 224, 0.5),
        ("vit_small_patch16_384", "vit_s16", 384, 0.5),
        ("vit_tiny_patch16_224.augreg_in21k", "vit_ti16", 224, 0.5),
        ("deit_small_patch16_224", "vit_s16", 224, 0.485),
    ],
)
def test_timm_names_are_aliases(name, canon, size, mean):
    cfg = vitlab.create_model(name, depth=1).config
    assert (cfg.name, cfg.img_size, cfg.mean[0]) == (canon, (size, size), mean)
    assert vitlab.models.resolve_name(name) == canon


def test_near_miss_suggests_timm_names():
    with pytest.raises(UnknownModelError, match="vit_base_patch16_224"):
        vitlab.create_model("vit_base_patch16_22")


def test_timm_kwargs():
    m = vitlab.create_model("vit_ti16", global_pool="avg", class_token=False, mlp_ratio=2.0, drop_path_rate=0.1, **ARCH)
    assert (m.config.pool, m.config.mlp_dim, m.global_pool) == ("gap", 384, "avg")
    with pytest.raises(ConfigError, match="global_pool"):
        vitlab.create_model("vit_ti16", global_pool="max")


def test_dynamic_img_size_is_taken_and_the_model_answers_as_timms_at_other_sizes():
    """timm's ``dynamic_img_size=True`` (DINOv2/v3 users type it) was a ``TypeError``; a vitlab model already takes
    any size the patch divides, its position embeddings resampled as timm's dynamic model resamples them."""
    ref = randomize(timm.create_model("vit_tiny_patch16_224", dynamic_img_size=True, **ARCH))
    ours = vitlab.create_model("vit_tiny_patch16_224", dynamic_img_size=True, **ARCH)
    ours.load_state_dict(ref.state_dict())
    ours.eval()
    for h, w in ((32, 32), (48, 48), (32, 64)):
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h + w))
        with torch.no_grad():
            assert_close_rel(ours(x), ref(x))
    with pytest.raises(ConfigError, match="dynamic_img_size: expected True or False"):
        vitlab.create_model("vit_ti16", dynamic_img_size="yes")


@pytest.mark.parametrize("out_indices", [None, 2, (0, -1)])
def test_features_only_gives_timms_maps_and_feature_info(out_indices):
    """timm's ``features_only=True`` (detection and segmentation backbones) was a ``TypeError``: the maps of the
    chosen blocks, equal to timm's ``FeatureGetterNet``'s, with its ``feature_info``."""
    kw = {} if out_indices is None else {"out_indices": out_indices}
    deep = {**ARCH, "depth": 4}  # (timm's default: the last 3 blocks)
    ref = randomize(timm.create_model("vit_tiny_patch16_224", **deep))
    theirs = timm.create_model("vit_tiny_patch16_224", features_only=True, **deep, **kw)
    theirs.model.load_state_dict(ref.state_dict(), strict=False)  # (timm's prunes the norm and the head)
    ours = vitlab.create_model("vit_tiny_patch16_224", features_only=True, **deep, **kw)
    ours.model.load_state_dict(ref.state_dict())
    ours.eval(), theirs.eval()
    x = images()
    with torch.no_grad():
        got, want = ours(x), theirs(x)
    assert len(got) == len(want) and all(g.shape == w.shape for g, w in zip(got, want, strict=True))
    for g, w in zip(got, want, strict=True):
        assert_close_rel(g, w)
    info, their_info = ours.feature_info, theirs.feature_info
    assert info.channels() == their_info.channels() and info.reduction() == their_info.reduction()
    assert info.module_name() == their_info.module_name() and info.get_dicts() == their_info.get_dicts()
    assert len(info) == len(their_info) and info[1] == their_info[1]
    for idx in (0, 1, [0, 3]):  # timm's idx: any block by its index, whichever blocks were chosen
        assert info.module_name(idx) == their_info.module_name(idx) and info.channels(idx) == their_info.channels(idx)


def test_features_only_refusals():
    with pytest.raises(ConfigError, match="out_indices: 5 is not a number of blocks in 1..2"):
        vitlab.create_model("vit_ti16", features_only=True, out_indices=5, **ARCH)
    with pytest.raises(ConfigError, match="are not block indices in -2..1"):
        vitlab.create_model("vit_ti16", features_only=True, out_indices=(0, 7), **ARCH)
    with pytest.raises(ConfigError, match="out_indices: an option of features_only=True"):
        vitlab.create_model("vit_ti16", out_indices=2, **ARCH)


@pytest.mark.parametrize("change", [{"img_size": 64}, {"img_size": (48, 32)}, {"patch_size": 8}])
def test_set_input_size_resamples_as_timms(both, change):
    """timm's ``set_input_size`` (an ``AttributeError`` before): the position embeddings (and a new patch size's
    projection, FlexiViT) resampled in place, the config and ``pretrained_cfg`` following; the logits at the new
    size are timm's."""
    ref, ours = both
    ref.set_input_size(**{k: (v, v) if k == "patch_size" else v for k, v in change.items()})
    ours.set_input_size(**change)
    assert ours.pos_embed.shape == ref.pos_embed.shape
    assert ours.pretrained_cfg["input_size"] == (3, *ref.patch_embed.img_size)  # (timm's keeps its default's)
    x = images(2, 32) if "patch_size" in change else torch.randn(2, 3, *ref.patch_embed.img_size)
    with torch.no_grad():
        assert_close_rel(ours(x), ref(x))


def test_set_input_size_of_other_stems_and_position_tables():
    hybrid = vitlab.create_model("vit_r_ti16", img_size=64, num_classes=3)
    with pytest.raises(ConfigError, match="only a plain patch embedding"):
        hybrid.set_input_size(patch_size=4)
    hybrid.set_input_size(img_size=96)
    assert hybrid.config.img_size == (96, 96) and hybrid.pos_embed.shape[1] == 1 + 3 * 3  # (a 32-pixel stride)
    rows_cols = vitlab.create_model("vit_ti16", img_size=32, posemb="learn2d", num_classes=3)
    rows_cols.set_input_size(img_size=(64, 48))
    assert (rows_cols.pos_embed_row.shape[1], rows_cols.pos_embed_col.shape[1]) == (4, 3)


def test_pretrained_resolves_the_public_name(monkeypatch, tmp_path):
    """pretrained=True loads the public weights for the name; offline that is an OfflineError (nothing downloads)."""
    from vitlab.checkpoints import hub

    asked = []

    def offline(name: str):
        asked.append(name)
        raise OfflineError(f"{name}: offline")

    monkeypatch.setattr(hub, "resolve", offline)
    for name in ("vit_ti16", "vit_tiny_patch16_224"):
        with pytest.raises(OfflineError):
            vitlab.create_model(name, pretrained=True)
    with pytest.raises(OfflineError):
        vitlab.create_model("vit_base_patch16_224.augreg_in1k", pretrained=True)
    with pytest.raises(OfflineError):
        vitlab.create_model("deit_small_patch16_224", pretrained=True)
    assert asked == [
        "augreg_in21k_ft_in1k/vit_ti16",
        "augreg_in21k_ft_in1k/vit_ti16",
        "timm/vit_base_patch16_224.augreg_in1k",
        "timm/deit_small_patch16_224.fb_in1k",
    ]
    # a "downloaded" file: the weights load, and the keyword arguments adapt the model
    ref = randomize(timm.create_model("vit_tiny_patch16_224", num_classes=5, img_size=32, depth=1))
    torch.save(ref.state_dict(), tmp_path / "w.pth")
    monkeypatch.setattr(hub, "resolve", lambda name: tmp_path / "w.pth")
    model = vitlab.create_model("vit_tiny_patch16_224", pretrained=True)
    with torch.no_grad():
        assert_close_rel(model(images()), ref(images()))
    assert vitlab.create_model("vit_ti16", pretrained=True, num_classes=3, global_pool="avg").global_pool == "avg"


def test_checkpoint_path(tmp_path):
    ref = randomize(timm.create_model("vit_tiny_patch16_224", **ARCH))
    torch.save(ref.state_dict(), tmp_path / "w.pth")
    model = vitlab.create_model("vit_tiny_patch16_224", checkpoint_path=tmp_path / "w.pth", **ARCH).eval()
    assert type(model) is accel.FastVisionTransformer
    with torch.no_grad():
        assert_close_rel(model(images()), ref(images()))
    with pytest.raises(CheckpointError, match="does not fit"):
        vitlab.create_model("vit_tiny_patch16_224", checkpoint_path=tmp_path / "w.pth", num_classes=5, img_size=32)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"indices": 2},
        {"indices": [0], "output_fmt": "NLC", "norm": True},
        {"indices": 1, "intermediates_only": True},
        {"indices": [1], "return_prefix_tokens": True, "intermediates_only": True},
    ],
)
def test_checklist_forward_intermediates_with_indices(both, kwargs):
    """With indices, timm's form; without, vitlab's dict (tests/test_models.py)."""
    ref, ours = both
    with torch.no_grad():
        got, want = ours.forward_intermediates(images(), **kwargs), ref.forward_intermediates(images(), **kwargs)
    if not kwargs.get("intermediates_only"):
        assert_close_rel(got[0], want[0])
        got, want = got[1], want[1]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for a, b in zip(g, w) if kwargs.get("return_prefix_tokens") else [(g, w)]:
            assert a.shape == b.shape
            assert_close_rel(a, b)


def test_torch_export_for_the_dynamo_exporter():
    """torch.export (what the dynamo-based ONNX exporter runs) captures the model; ONNX itself if installed."""
    model = vitlab.create_model("vit_ti16", **ARCH).eval()
    x = images()
    program = torch.export.export(model, (x,))
    with torch.no_grad():
        assert_close_rel(program.module()(x), model(x))


def test_onnx_export_dynamo(tmp_path):
    pytest.importorskip("onnxscript")
    model = vitlab.create_model("vit_ti16", **ARCH).eval()
    torch.onnx.export(model, (images(),), str(tmp_path / "m.onnx"), dynamo=True)
    assert (tmp_path / "m.onnx").stat().st_size > 0

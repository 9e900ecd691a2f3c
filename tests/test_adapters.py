"""Parameter-efficient fine-tuning (issue 60): LoRA, SSF and bias-only tuning applied to every family of ViT vitlab
builds, by the layers' roles; merged back, the model is a plain ViT that computes what the wrapped one did (to float
rounding), with the plain model's parameter names; only the adapters and the head train; the speed paths stand aside
for a wrapped model; LoRA's adapters alone in ``peft``'s files; and the refusals of options that cannot apply."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors import safe_open
from torch import nn

import vitlab
from conftest import assert_close_rel
from vitlab.accel import accelerate
from vitlab.adapters import (
    DEFAULT_TARGETS,
    SSF,
    LoRALinear,
    apply_tuning,
    has_adapters,
    merge_adapters,
    merged_copy,
    merged_state_dict,
    target_linears,
    trainable_counts,
)
from vitlab.adapters.peft_files import adapter_config, adapter_state, save_adapters
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.train.conf.options import OptionError
from vitlab.train.conf.rules import validate
from vitlab.train.conf.train_config import build_config

TINY = {"img_size": (16, 16), "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "mlp_dim": 48,
        "num_classes": 3}  # fmt: skip
FAMILIES = {
    "paper": {},
    "swiglu_qv_bias_rope_layerscale": {"mlp": "swiglu", "key_bias": False, "rope": True, "posemb": "none",
                                       "init_values": 0.1, "qk_norm": True, "mlp_norm": True, "attn_norm": True},
    "gap_fc_norm": {"pool": "gap", "class_token": False, "fc_norm": True},
    "axial": {"attention": "axial"},
    "hybrid": {"hybrid_layers": (), "patch_size": 1, "img_size": (32, 32)},
    "distilled": {"dist_token": True},
}  # fmt: skip


def tiny(family: str = "paper", *, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = accelerate(VisionTransformer(ViTConfig(**{**TINY, **FAMILIES[family]})))
    with torch.no_grad():  # a trained head and biases: a zero head would hide what the adapters do
        for name, p in m.named_parameters():
            if name.startswith("head") or name.endswith("bias"):
                p.normal_(0, 0.2)
    return m


def images(model: nn.Module, n: int = 4) -> torch.Tensor:
    side = model.config.img_size[0]
    return torch.randn(n, 3, side, side, generator=torch.Generator().manual_seed(1))


def perturb_adapters(model: nn.Module) -> None:
    """Move every adapter off its starting point, as training does (LoRA's B starts at zero, SSF at the identity)."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.weight.copy_(torch.randn(m.lora_B.weight.shape, generator=g) * 0.1)
            elif isinstance(m, SSF):
                m.ssf_scale.copy_(1 + torch.randn(m.ssf_scale.shape, generator=g) * 0.1)
                if m.ssf_shift is not None:
                    m.ssf_shift.copy_(torch.randn(m.ssf_shift.shape, generator=g) * 0.1)


def logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        out = model(x)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("method", ["lora", "ssf"])
def test_the_merged_model_computes_what_the_wrapped_one_does(family, method):
    model = tiny(family)
    x = images(model)
    base = logits(model, x)
    apply_tuning(model, method, rank=4, alpha=8)
    assert has_adapters(model)
    assert_close_rel(logits(model, x), base, rtol=1e-5)  # B = 0 / identity SSF: it starts as the base model
    perturb_adapters(model)
    wrapped = logits(model, x)
    assert (wrapped - base).abs().max() > 1e-3  # the adapters change the function
    plain = merged_copy(model)
    assert has_adapters(model) and not has_adapters(plain)  # a copy: the trained model keeps its adapters
    assert_close_rel(logits(plain, x), wrapped, rtol=1e-5)
    reference = tiny(family)
    assert plain.state_dict().keys() == reference.state_dict().keys()  # the plain model's names, no adapter keys
    assert type(plain) is type(reference)


def test_lora_merges_as_w_plus_alpha_over_r_b_a():
    model = tiny()
    w = model.blocks[0].attn.qkv.weight.detach().clone()
    apply_tuning(model, "lora", rank=4, alpha=2)
    perturb_adapters(model)
    layer = model.blocks[0].attn.qkv
    expected = w + (2 / 4) * layer.lora_B.weight @ layer.lora_A.weight
    merge_adapters(model)
    assert type(model.blocks[0].attn.qkv) is nn.Linear
    assert_close_rel(model.blocks[0].attn.qkv.weight.detach(), expected.detach(), rtol=1e-6)


def test_lora_starts_at_kaiming_a_and_zero_b_with_the_base_frozen():
    model = tiny()
    apply_tuning(model, "lora", rank=4)
    layer = model.blocks[1].mlp.fc2
    assert isinstance(layer, LoRALinear) and layer.scaling == 1.0  # alpha defaults to the rank
    assert torch.count_nonzero(layer.lora_B.weight) == 0 and torch.count_nonzero(layer.lora_A.weight) > 0
    bound = 1 / layer.in_features**0.5  # kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)), nn.Linear's draw
    assert layer.lora_A.weight.abs().max() <= bound
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n in trainable if ".lora_" in n or n.startswith("head.")}
    assert "head.weight" in trainable and "head.bias" in trainable


@pytest.mark.parametrize(("method", "rank"), [("lora", 4), ("lora", 1), ("ssf", 0), ("bias", 0)])
def test_trainable_parameter_count(method, rank):
    model = tiny()
    total_before = sum(p.numel() for p in model.parameters())
    apply_tuning(model, method, rank=max(rank, 1))
    d, h, c, depth = 32, 48, 3, 2
    head = d * c + c
    if method == "lora":  # r (in + out) per linear: qkv (d -> 3d), proj (d -> d), fc1 (d -> h), fc2 (h -> d)
        adapters = depth * rank * ((d + 3 * d) + (d + d) + (d + h) + (h + d))
    elif method == "ssf":  # scale + shift per output channel of the four linears, and of every LayerNorm (2 a block
        adapters = depth * 2 * (3 * d + d + h + d) + (2 * depth + 1) * 2 * d  # and the final one)
    else:  # every bias: qkv, proj, fc1, fc2, both LayerNorms of each block, the final LayerNorm, the patch projection
        adapters = depth * (3 * d + d + h + d + 2 * d) + d + d
    trainable, total = trainable_counts(model)
    assert trainable == adapters + head
    assert total == total_before + (adapters if method != "bias" else 0)


def test_only_the_adapters_and_the_head_get_gradients():
    model = tiny()
    apply_tuning(model, "lora", rank=2)
    model.train()
    out = model(images(model))
    out.sum().backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(".lora_" in n or n.startswith("head.") for n in with_grad)


def test_bias_tuning_trains_every_bias_and_changes_no_layer():
    model = tiny("swiglu_qv_bias_rope_layerscale")
    layers = [type(m) for m in model.modules()]
    apply_tuning(model, "bias")
    assert [type(m) for m in model.modules()] == layers and not has_adapters(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "blocks.0.attn.q_bias" in trainable and "blocks.0.attn.v_bias" in trainable
    assert "blocks.0.mlp.fc1_g.bias" in trainable and "blocks.0.norm1.bias" in trainable
    assert "blocks.0.attn.proj.weight" not in trainable and "head.weight" in trainable
    assert merged_copy(model) is model  # nothing to merge: the model is plain already


def test_targets_by_role_on_each_mlp():
    assert target_linears(tiny(), ["fc1"]) == ["blocks.0.mlp.fc1", "blocks.1.mlp.fc1"]
    swiglu = target_linears(tiny("swiglu_qv_bias_rope_layerscale"), ["fc1", "attn.proj"])
    assert swiglu == ["blocks.0.attn.proj", "blocks.0.mlp.fc1_g", "blocks.0.mlp.fc1_x",
                      "blocks.1.attn.proj", "blocks.1.mlp.fc1_g", "blocks.1.mlp.fc1_x"]  # fmt: skip
    axial = target_linears(tiny("axial"), ["qkv"])
    assert axial == [f"blocks.{i}.{half}.attn.qkv" for i in range(2) for half in ("row", "col")]
    with pytest.raises(ConfigError, match="'q_proj' names no linear layer of the encoder blocks"):
        apply_tuning(tiny(), "lora", targets=["q_proj"])


@pytest.mark.parametrize("method", ["lora", "ssf"])
def test_adapters_train_through_the_fused_block_with_the_plain_paths_gradients(method):
    """A LoRA- or SSF-wrapped paper block trains through the fused training node with its effective weights
    (LoRA's W + (alpha/r) B A; SSF's diag(scale) W, scale * b + shift, on the LayerNorms too), so an adapted step
    costs a full fine-tune's, not the plain forward's extra products: its output and the adapters' and head's
    gradients equal the plain autograd path's (the speed paths switched off) to float rounding, and its output equals
    the merged plain model's. A block of another family (SwiGLU) keeps the plain forward."""
    from vitlab.accel import set_enabled, training_path

    model = tiny()
    apply_tuning(model, method, rank=4)
    perturb_adapters(model)
    plain = merged_copy(model).requires_grad_(True)
    model.train()
    plain.train()
    assert not model.blocks[0].accelerable() and plain.blocks[0].accelerable()
    assert training_path(model) == training_path(plain) != "autograd"
    x = images(model, 8)

    def grads() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        out = model(x)
        out.square().sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    fused_out, fused = grads()
    set_enabled(False)
    try:
        plain_out, reference = grads()
    finally:
        set_enabled(True)
    assert_close_rel(fused_out, plain_out)
    assert fused.keys() == reference.keys() and any((".lora_A." if method == "lora" else ".ssf_scale") in n
                                                    for n in fused)  # fmt: skip
    for n in fused:
        assert_close_rel(fused[n], reference[n])
    assert_close_rel(fused_out, plain(x).detach())
    other = tiny("swiglu_qv_bias_rope_layerscale")
    apply_tuning(other, method, rank=4)
    assert training_path(other.train()) == "autograd"


def _fused_and_plain_grads(model: nn.Module, x: torch.Tensor) -> tuple[dict, dict]:
    """The trained parameters' gradients of ``model(x).square().sum()`` on the speed paths and on the plain autograd
    path, each forward after the same seed (the same stochastic-depth masks)."""
    from vitlab.accel import set_enabled

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        model(x).square().sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    fused = grads()
    set_enabled(False)
    try:
        return fused, grads()
    finally:
        set_enabled(True)


@pytest.mark.parametrize("drop_path", [0.0, 0.3])
@pytest.mark.parametrize("base_trains", [False, True])
def test_lora_on_the_fused_block_forms_the_factors_gradients_by_thin_products(drop_path, base_trains, monkeypatch):
    """Over a frozen weight, LoRA's factors get their gradients from the layer's input and output gradient inside
    the fused node (dB = s dY^T (X A^T), dA = s (dY B)^T X: no full weight gradient), four layers a block, equal to
    the plain autograd path's, with stochastic depth too (the same masks: the same seed before each forward). A
    base weight that trains as well takes the effective weight through autograd instead (no thin products)."""
    from vitlab.accel import fused_block

    model = tiny()
    for b in model.blocks:
        b.drop_path1.p = b.drop_path2.p = drop_path
    apply_tuning(model, "lora", rank=4, alpha=2.0)  # s = 0.5: a scale left out shows
    perturb_adapters(model)
    if base_trains:
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.base_layer.weight.requires_grad_(True)
    model.train()
    calls = []
    real = fused_block._lora_grads
    monkeypatch.setattr(fused_block, "_lora_grads", lambda *a: calls.append(a[2] is not None) or real(*a))
    fused, reference = _fused_and_plain_grads(model, images(model, 8))
    assert calls == [not base_trains] * (4 * len(model.blocks))  # the fused pass's (the plain one has no node)
    assert fused.keys() == reference.keys() and any(".lora_B." in n for n in fused)
    for n in fused:
        assert_close_rel(fused[n], reference[n])


@pytest.mark.parametrize("drop_path", [0.0, 0.3])
@pytest.mark.parametrize("small_scale", [False, True])
def test_ssf_on_the_fused_block_forms_the_scales_gradients_from_the_layers_outputs(drop_path, small_scale, monkeypatch):
    """Over a frozen linear, SSF's scale and shift get their gradients inside the fused node from the layer's kept
    output (d beta = sum dY, d gamma = (sum dY * y - beta d beta) / gamma: no full weight gradient), four layers a
    block, on the C kernels where they are and with stochastic depth, equal to the plain autograd path's. A layer
    whose scale fell below the floor takes autograd's product through diag(gamma) W instead."""
    from vitlab.accel import fused_block

    model = tiny()
    for b in model.blocks:
        b.drop_path1.p = b.drop_path2.p = drop_path
    apply_tuning(model, "ssf")
    perturb_adapters(model)
    if small_scale:
        with torch.no_grad():
            model.blocks[0].mlp.fc2.ssf_scale[3] = fused_block.SSF_SCALE_FLOOR / 2
    model.train()
    calls = []
    real = fused_block._ssf_grads
    monkeypatch.setattr(fused_block, "_ssf_grads", lambda *a: calls.append(a[2] is not None) or real(*a))
    fused, reference = _fused_and_plain_grads(model, images(model, 8))
    assert len(calls) == 4 * len(model.blocks) - small_scale and all(calls)
    assert fused.keys() == reference.keys() and any(".ssf_scale" in n for n in fused)
    for n in fused:
        assert_close_rel(fused[n], reference[n])


def test_the_merged_model_saves_and_loads_as_a_plain_vit(tmp_path):
    model = tiny("swiglu_qv_bias_rope_layerscale")
    apply_tuning(model, "lora", rank=4)
    perturb_adapters(model)
    x = images(model)
    want = logits(model, x)
    vitlab.save(merged_copy(model), tmp_path / "m")
    with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
        keys = list(f.keys())  # (a safetensors file, not a dict)
    assert keys and not [k for k in keys if "lora" in k or "base_layer" in k]
    assert_close_rel(logits(vitlab.load(tmp_path / "m"), x), want, rtol=1e-5)


def test_the_adapters_alone_in_peft_files(tmp_path):
    model = tiny()
    apply_tuning(model, "lora", rank=4, alpha=8)
    state = adapter_state(model)
    assert state["base_model.model.blocks.0.attn.qkv.lora_A.weight"].shape == (4, 32)
    assert state["base_model.model.blocks.1.mlp.fc2.lora_B.weight"].shape == (32, 4)
    assert {k for k in state if not k.endswith(("lora_A.weight", "lora_B.weight"))} == {
        "base_model.model.head.weight",
        "base_model.model.head.bias",
    }
    assert len(state) == 2 * 4 * 2 + 2
    save_adapters(model, tmp_path / "adapters", base="runs/src")
    cfg = json.loads((tmp_path / "adapters" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8
    assert cfg["target_modules"][:2] == ["blocks.0.attn.qkv", "blocks.0.attn.proj"] and len(cfg["target_modules"]) == 8
    assert cfg["modules_to_save"] == ["head"] and cfg["base_model_name_or_path"] == "runs/src"
    with safe_open(str(tmp_path / "adapters" / "adapter_model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(state) and f.metadata()["vitlab"] == "lora-adapters"
    assert adapter_config(model, base=None)["base_model_name_or_path"] is None


# -- the options ----------------------------------------------------------------------------------------------


def _config(**values):
    return build_config({"init": "runs/src", **values}, given=list(values))


def test_lora_implies_tune_lora_and_tune_lora_defaults_to_peft_rank():
    assert _config(**{"recipe.lora": 4}).recipe.tuning == "lora"
    r = _config(**{"recipe.tune": "lora"}).recipe
    assert (r.tuning, r.lora_rank) == ("lora", 8)
    assert _config(**{"recipe.freeze": True}).recipe.tuning == "head"
    assert _config(**{"recipe.tune": "head"}).recipe.tuning == "head"
    assert _config().recipe.tuning == "full"
    assert _config(**{"recipe.lora": 0}).recipe.tuning == "full"  # --lora 0: off


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"recipe.lora": -1}, "--lora: a rank must be >= 1 (0: no LoRA), got -1"),
        (
            {"recipe.lora": 4, "recipe.tune": "full"},
            "--lora: trains LoRA adapters, and --tune full trains every weight",
        ),
        ({"recipe.lora": 4, "recipe.tune": "ssf"}, "--tune ssf trains scales and shifts"),
        ({"recipe.freeze": True, "recipe.tune": "lora"}, "--freeze: trains the head alone, and --tune lora"),
        ({"recipe.lora_alpha": 16.0}, "--lora-alpha: scales LoRA's updates: give --lora R too"),
        ({"recipe.lora": 4, "recipe.lora_alpha": 0.0}, "--lora-alpha: must be positive"),
        ({"recipe.lora_targets": ("qkv",), "recipe.tune": "bias"}, "--lora-targets: names the layers LoRA or SSF"),
        ({"recipe.tune": "head", "recipe.head_warmup": 3}, "--head-warmup: --freeze already trains only the head"),
    ],
)
def test_options_that_cannot_apply_are_refused_by_the_recipe(values, message):
    with pytest.raises(OptionError) as e:
        _config(**values)
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"init": None, "recipe.tune": "ssf"}, "--tune ssf adapts a pre-trained model: give it with vitlab finetune"),
        ({"init": None, "recipe.lora": 4}, "--lora 4 adapts a pre-trained model"),
        ({"recipe.lora": 4, "fsdp": True}, "--fsdp with --lora 4: not supported"),
        ({"keep_adapters": True, "recipe.tune": "ssf"}, "--keep-adapters writes LoRA's adapters: give --lora R too"),
        ({"recipe.lora": 4, "recipe.optimizer": "muon"}, "--optimizer muon with --tune: not supported"),
    ],
)
def test_options_that_cannot_apply_are_refused_by_the_rules(values, message):
    cfg = build_config({"init": "runs/src", **values}, given=list(values))
    with pytest.raises(OptionError) as e:
        validate(cfg)
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora", "-1"], "vitlab finetune: error: --lora: a rank must be >= 1 (0: no LoRA), got -1"),
        (["--lora", "4", "--tune", "full"], "vitlab finetune: error: --lora: trains LoRA adapters, and --tune full"),
        (["--keep-adapters"], "vitlab finetune: error: --keep-adapters writes LoRA's adapters"),
        (["--lora", "4", "--lora-targets", "qkv,,"], ""),
        (["--lora-targets", "a b"], "not a module name"),
        (["--tune", "dora"], "invalid choice: 'dora'"),
    ],
)
def test_the_cli_refuses_in_one_line(tmp_path, capsys, argv, message):
    args = [
        "finetune",
        "--init",
        str(tmp_path / "nowhere"),
        "--data",
        str(tmp_path / "d"),
        "--out",
        str(tmp_path / "o"),
    ]
    try:
        code = main([*args, *argv])
    except SystemExit as e:  # argparse's own errors (a bad value of a flag's type or choices)
        code = e.code
    err = capsys.readouterr().err
    if not message:  # empty items are dropped, not an error: the run goes on to --init
        assert "--lora-targets" not in err
        return
    assert code == 2, err
    assert message in err.strip().splitlines()[-1] and "Traceback" not in err


def test_train_has_no_lora_option(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--lora", "4"])
    assert e.value.code == 2
    assert "unrecognized arguments: --lora" in capsys.readouterr().err


def test_the_option_table_the_recipe_and_the_adapters_name_the_same_methods():
    from vitlab import adapters
    from vitlab.train.conf.options import option
    from vitlab.train.conf.recipes import LORA_RANK, TUNE_METHODS

    assert TUNE_METHODS == adapters.TUNE_METHODS == option("--tune").choices
    assert LORA_RANK == adapters.DEFAULT_RANK


def test_the_merged_state_dict_is_the_merged_copys():
    model = tiny("swiglu_qv_bias_rope_layerscale")
    apply_tuning(model, "ssf")
    perturb_adapters(model)
    want = merged_copy(model).state_dict()
    got = merged_state_dict(model)
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_overwrite_removes_the_adapters_vitlab_wrote_and_stops_at_others(tmp_path):
    from safetensors.torch import save_file

    from vitlab.train.persist.claim import claim_run_folder

    model = tiny()
    apply_tuning(model, "lora", rank=2)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for run in (ours, theirs):
        run.mkdir()
        (run / "metrics.jsonl").write_text("")  # a run was here
    save_adapters(model, ours / "adapters", base=None)
    claim_run_folder(ours, overwrite=True, init=None, log=lambda line: None)
    assert not (ours / "adapters").exists()
    (theirs / "adapters").mkdir()
    save_file({"x": torch.zeros(1)}, str(theirs / "adapters" / "adapter_model.safetensors"))  # another program's
    with pytest.raises(ConfigError, match="adapters/adapter_model.safetensors, which vitlab did not write"):
        claim_run_folder(theirs, overwrite=True, init=None, log=lambda line: None)
    assert (theirs / "adapters" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize(
    ("method", "rank", "targets"),
    [
        ("lora", 4, None),
        ("lora", 2, ("qkv",)),
        ("ssf", 8, None),
        ("bias", 8, None),
        ("head", 8, None),
        ("full", 8, None),
    ],
)
def test_the_memory_fit_counts_the_parameters_a_method_trains(family, method, rank, targets):
    """The memory estimate gives gradients and optimizer state to what trains only (issue 60: a LoRA run's states are
    a fraction of a full run's): its count, on a one-block ViT on the meta device scaled to the depth, equals what
    the built model trains, on every family; the estimate's states shrink by the difference."""
    from vitlab.train.conf.recipes import RECIPES
    from vitlab.train.sizing.memory import estimate, trained_parameters

    model = tiny(family)
    params = sum(p.numel() for p in model.parameters())
    if method == "head":
        model.requires_grad_(False)
        model.head.requires_grad_(True)
    else:
        apply_tuning(model, method, rank=rank, targets=targets or DEFAULT_TARGETS)
    auto = RECIPES["auto"]
    recipe = dataclasses.replace(auto, tune=method, lora=rank if method == "lora" else 0, lora_targets=targets)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trained_parameters(model.config, recipe, params=params) == trained
    cfg = build_config({"data": "unused"})
    full = estimate(cfg, model.config, recipe=auto, micro=2, eval_batch=2, device_type="cpu", num_classes=3)
    mine = estimate(cfg, model.config, recipe=recipe, micro=2, eval_batch=2, device_type="cpu", num_classes=3)
    assert full.states - mine.states == (params - trained) * (4 + 8)  # AdamW: two fp32 moments a parameter

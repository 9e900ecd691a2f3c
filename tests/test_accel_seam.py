"""The speed seam never changes what a user's model computes: every speed path of
:mod:`vitlab.accel` stands aside when the model is not exactly as built (hooks, wrapped or
replaced layers, quantisation, tracing), and the fast classes agree with the plain ones."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import vitlab
from vitlab import accel
from vitlab.models import Block, VisionTransformer

TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=5)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def randomised(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model


def pair(**overrides) -> tuple[nn.Module, nn.Module]:
    """A plain model and its accelerated copy with the same weights."""
    plain = randomised(VisionTransformer(**{**TINY, **overrides}))
    fast = accel.accelerate(copy.deepcopy(plain))
    assert type(fast) is accel.FastVisionTransformer and type(fast.blocks[0]) is accel.FastBlock
    return plain, fast


class LoRA(nn.Module):
    """A PEFT-style adapter around a linear layer: exposes ``weight``/``bias`` and adds a low-rank update."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.base = base
        self.lora_a = nn.Parameter(torch.randn(rank, base.in_features) * 0.5)
        self.lora_b = nn.Parameter(torch.randn(base.out_features, rank) * 0.5)

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.lora_a.t() @ self.lora_b.t()


class NoWeight(nn.Module):
    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.inner = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 2.0


def test_create_model_and_load_are_fast_and_the_switch_gives_the_plain_class(tmp_path) -> None:
    model = vitlab.create_model("vit_ti16", img_size=32, num_classes=3, depth=1)
    assert type(model) is accel.FastVisionTransformer
    vitlab.save(model, tmp_path / "m")
    assert type(vitlab.load(tmp_path / "m")) is accel.FastVisionTransformer
    accel.set_enabled(False)
    try:
        assert type(vitlab.create_model("vit_ti16", img_size=32, num_classes=3, depth=1)) is VisionTransformer
        assert type(vitlab.load(tmp_path / "m")) is VisionTransformer
    finally:
        accel.set_enabled(True)
    assert set(model.state_dict()) == set(VisionTransformer(model.config).state_dict())


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("wrapper", [LoRA, NoWeight])
def test_wrapped_qkv_runs_and_gets_gradients(train: bool, wrapper: type[nn.Module]) -> None:
    plain, fast = pair()
    x = torch.randn(3, 3, 32, 32)
    for m in (plain, fast):
        torch.manual_seed(1)
        for blk in m.blocks:
            blk.attn.qkv = wrapper(blk.attn.qkv)
        m.train(train)
    calls = []
    fast.blocks[0].attn.qkv.register_forward_pre_hook(lambda *_: calls.append(1))
    before = randomised(VisionTransformer(**TINY))  # the same weights without the adapter
    with torch.set_grad_enabled(train):
        want, got, base = plain(x), fast(x), before.train(train)(x)
    assert rel_err(got, want) < 1e-5
    assert rel_err(got, base) > 1e-3  # the adapter changed the output
    assert calls  # its forward ran
    if train:
        got.square().sum().backward()
        extra = [p for n, p in fast.named_parameters() if "lora" in n or "inner" in n]
        assert extra and all(p.grad is not None and p.grad.abs().sum() > 0 for p in extra)


@pytest.mark.parametrize(
    "where", ["blocks.1", "blocks.1.attn.qkv", "blocks.0.mlp.fc1", "blocks.0.attn", "blocks.0.mlp", "norm"]
)
@pytest.mark.parametrize("train", [False, True])
def test_forward_hooks_fire_and_see_what_the_plain_model_shows(where: str, train: bool) -> None:
    plain, fast = pair()
    x = torch.randn(3, 3, 32, 32)
    seen: dict[str, list[tuple[int, ...]]] = {"plain": [], "fast": []}
    for key, m in (("plain", plain), ("fast", fast)):
        m.train(train)
        m.get_submodule(where).register_forward_hook(lambda _m, _a, out, k=key: seen[k].append(tuple(out.shape)))
        with torch.set_grad_enabled(train):
            out = m(x)
        if key == "plain":
            want = out
    assert seen["fast"] == seen["plain"] and seen["fast"]
    assert rel_err(out, want) < 1e-5


def test_hook_that_changes_an_output_changes_the_logits() -> None:
    _, fast = pair()
    fast.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = fast(x)
        h = fast.blocks[0].mlp.fc1.register_forward_hook(lambda _m, _a, out: out * 0)
        during = fast(x)
        h.remove()
        after = fast(x)
    assert rel_err(during, before) > 1e-3
    assert rel_err(after, before) < 1e-6


def test_block_returns_a_tensor_like_timm() -> None:
    _, fast = pair()
    z = torch.randn(2, 17, 64)
    for blk in (fast.blocks[0].eval(), Block(dim=64, num_heads=4, mlp_dim=128)):
        with torch.no_grad():
            out = blk(z)
        assert isinstance(out, torch.Tensor) and out.shape == z.shape
        out, weights = blk(z, return_attention=True)
        assert weights.shape == (2, 4, 17, 17)


def test_quantize_dynamic_works_and_matches_the_plain_quantised_model() -> None:
    plain, fast = pair()
    x = torch.randn(2, 3, 32, 32)
    qp = torch.ao.quantization.quantize_dynamic(plain.eval(), {nn.Linear}, dtype=torch.qint8)
    qf = torch.ao.quantization.quantize_dynamic(fast.eval(), {nn.Linear}, dtype=torch.qint8)
    with torch.no_grad():
        want, got, full = qp(x), qf(x), plain(x)
    assert rel_err(got, want) < 1e-5
    assert rel_err(got, full) > 1e-6  # the quantised layers really ran


def test_torchvision_feature_extractor_traces_both_classes() -> None:
    from torchvision.models.feature_extraction import create_feature_extractor

    plain, fast = pair()
    x = torch.randn(2, 3, 32, 32)
    outs = []
    for m in (plain.eval(), fast.eval()):
        fe = create_feature_extractor(m, return_nodes={"blocks.1": "last", "norm": "norm", "head": "logits"})
        with torch.no_grad():
            outs.append(fe(x))
    assert outs[1]["last"].shape == outs[1]["norm"].shape == (2, 17, 64)
    for k in ("last", "norm", "logits"):
        assert rel_err(outs[1][k], outs[0][k]) < 1e-5
    with torch.no_grad():
        assert rel_err(outs[0]["logits"], plain(x)) < 1e-5


def test_instance_forward_patch_and_replaced_norm_run() -> None:
    plain, fast = pair()
    x = torch.randn(2, 3, 32, 32)
    for m in (plain, fast):
        m.eval()
        m.blocks[1].norm1 = nn.Identity()
        mlp = m.blocks[0].mlp
        mlp.forward = lambda t, f=mlp.forward: f(t) * 0.5
    with torch.no_grad():
        assert rel_err(fast(x), plain(x)) < 1e-5


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("pool", ["cls", "gap"])
def test_fast_class_matches_plain_class(train: bool, pool: str) -> None:
    plain, fast = pair(pool=pool)
    x = torch.randn(4, 3, 32, 32)
    plain.train(train), fast.train(train)
    with torch.set_grad_enabled(train):
        want, got = plain(x), fast(x)
    assert rel_err(got, want) < 1e-5
    if train:
        want.square().sum().backward()
        got.square().sum().backward()
        for (n, p), q in zip(plain.named_parameters(), fast.parameters()):
            assert rel_err(q.grad, p.grad) < 1e-4, n


def test_disabled_runs_the_plain_forward_on_a_fast_model(monkeypatch) -> None:
    from vitlab.accel import fused_block, onednn

    _, fast = pair()
    x = torch.randn(2, 3, 32, 32)

    def boom(*_a, **_k):
        raise AssertionError("a speed path ran while disabled")

    monkeypatch.setattr(onednn, "block_forward", boom)
    monkeypatch.setattr(fused_block, "block_forward", boom)
    monkeypatch.setattr(accel.FastBlock, "forward_cls", boom)
    with accel.disabled():
        with torch.no_grad():
            fast.eval()(x)
        fast.train()(x).sum().backward()

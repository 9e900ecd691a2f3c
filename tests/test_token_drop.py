"""Token dropping in training (PatchDropout, Liu et al. 2022): ``patch_drop_rate`` / ``vitlab train --token-drop``."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import assert_close_rel
from imagefolder import tiny_folder
from vitlab.accel import FastVisionTransformer
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.models import VisionTransformer, ViTConfig

CFG = dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5)


def model(cls=VisionTransformer, **kw):
    torch.manual_seed(0)
    return cls(ViTConfig(**{**CFG, "patch_drop_rate": 0.5, **kw}))


@pytest.mark.parametrize("rate, kept", [(0.5, 32), (0.75, 16), (0.9, 6), (0.99, 1)])
def test_training_keeps_the_right_number_of_patch_tokens_and_the_class_token(rate: float, kept: int) -> None:
    m = model(patch_drop_rate=rate).train()
    x = torch.randn(3, 3, 32, 32)
    full = m.eval().embed(x)
    m.train()
    torch.manual_seed(5)
    z = m.embed(x)
    torch.manual_seed(5)
    idx = m.patch_drop.keep_indices(full)
    assert z.shape == (3, 1 + kept, 32) and idx.shape == (3, kept)  # 64 patches: int(64 * (1 - rate)), >= 1
    assert_close_rel(z[:, 0], full[:, 0])  # the class token always comes first, unchanged
    # the kept tokens are the image's own patch tokens with their position embeddings, no repeats
    assert all(row.unique().numel() == kept for row in idx)
    assert_close_rel(z[:, 1:], torch.stack([full[b, 1:][idx[b]] for b in range(3)]))
    assert not torch.equal(idx[0], idx[1]) or kept == 1  # each image draws its own subset


def test_evaluation_sees_every_token_and_registers_are_kept() -> None:
    m = model(reg_tokens=2)
    x = torch.randn(2, 3, 32, 32)
    assert m.eval().embed(x).shape == (2, 3 + 64, 32)
    with torch.no_grad():
        assert m(x).shape == (2, 5)
    assert m.train().embed(x).shape == (2, 3 + 32, 32)
    assert m.patch_drop.num_prefix_tokens == 3


def test_rate_zero_builds_no_module_and_bad_rates_are_one_line_errors() -> None:
    assert isinstance(model(patch_drop_rate=0.0).patch_drop, torch.nn.Identity)
    for bad in (1.0, -0.1):
        with pytest.raises(ConfigError, match="patch_drop_rate"):
            ViTConfig(**CFG, patch_drop_rate=bad)
    with pytest.raises(ConfigError, match="patch_drop_rate"):
        ViTConfig(**CFG, patch_drop_rate=0.5, attention="axial")
    from vitlab.models.mpp import MaskedPatchPrediction

    with pytest.raises(ConfigError, match="patch_drop_rate"):  # it predicts every patch
        MaskedPatchPrediction(model())


def test_gap_pooling_trains_with_dropped_tokens() -> None:
    m = model(pool="gap", class_token=False).train()
    x = torch.randn(4, 3, 32, 32)
    feats = m.forward_features(x)
    assert feats.shape == (4, 32, 32)  # no prefix token: 32 of the 64 patches
    assert_close_rel(m.forward_head(feats, pre_logits=True), m.fc_norm(feats.mean(dim=1)))
    m.head.weight.data.normal_()
    m(x).square().sum().backward()
    assert m.patch_embed.proj.weight.grad.abs().sum() > 0
    assert m.eval().forward_features(x).shape == (4, 64, 32)


@pytest.mark.parametrize("pool", ["cls", "gap"])
def test_fast_class_drops_the_same_tokens_as_the_plain_class(pool: str) -> None:
    """The class-token-only last block, the fused training blocks and the batch chunks see the shorter
    sequence: same seed, same kept tokens, same logits and gradients as the plain class."""
    kw = {"pool": pool, "class_token": pool == "cls"}
    plain, fast = model(**kw), model(FastVisionTransformer, **kw)
    fast.load_state_dict(plain.state_dict())
    for m in (plain, fast):
        m.head.weight.data.normal_(generator=torch.Generator().manual_seed(1))
    x = torch.randn(8, 3, 32, 32)
    outs = []
    for m in (plain, fast):
        m.train()
        torch.manual_seed(123)
        out = m(x)
        out.square().sum().backward()
        outs.append(out)
    assert_close_rel(outs[1], outs[0], rtol=1e-5)
    for (n, p), q in zip(plain.named_parameters(), fast.parameters()):
        assert_close_rel(q.grad, p.grad, rtol=1e-4, msg=n)
    fast.inference_chunk_bytes = 1  # would chunk a gradient-free forward: not while tokens are dropped
    with torch.no_grad():
        torch.manual_seed(7)
        a = plain(x)
        torch.manual_seed(7)
        b = fast(x)
    assert fast.inference_chunk_size(x) == 8
    assert_close_rel(b, a, rtol=1e-5)
    with torch.no_grad():  # evaluation: every token, chunked again, the same logits
        plain.eval(), fast.eval()
        assert fast.inference_chunk_size(x) < 8
        assert_close_rel(fast(x), plain(x), rtol=1e-5)


@pytest.mark.slow
def test_token_drop_reaches_the_model_through_vitlab_train(tmp_path, capsys) -> None:
    data = tiny_folder(tmp_path / "data", size=8)
    out = tmp_path / "run"
    args = ["train", "--data", str(data), "--out", str(out), "--dim", "16", "--depth", "1", "--heads", "2"]
    args += ["--patch-size", "2", "--epochs", "1", "--batch-size", "8", "--no-progress", "--token-drop", "0.5"]
    assert main(args) == 0
    assert "token drop 0.5 in training" in capsys.readouterr().out
    cfg = json.loads((out / "model" / "config.json").read_text())
    assert cfg["patch_drop_rate"] == 0.5
    import vitlab

    m = vitlab.load(out / "model")
    assert m.config.patch_drop_rate == 0.5 and not m.training
    assert m.embed(torch.randn(1, 3, 8, 8)).shape[1] == 1 + 16  # loaded for evaluation: every token
    assert main([*args[:-2], "--token-drop", "1.5", "--out", str(tmp_path / "bad")]) == 2
    assert "--token-drop: must be in [0, 1)" in capsys.readouterr().err

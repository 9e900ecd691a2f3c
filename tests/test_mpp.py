"""Masked patch prediction (Sec. 4.6, Appendix B.1.2)."""

from __future__ import annotations

import pytest
import torch

from vitlab.models import VisionTransformer
from vitlab.models.mpp import MaskedPatchPrediction, mean_colour_targets

TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=0)


def test_mean_colour_targets_known_values() -> None:
    img = torch.zeros(1, 3, 8, 8)
    img[:, 0, :4, :4] = 1.0  # top-left patch pure red -> (7, 0, 0)
    img[:, :, 4:, 4:] = 0.5  # bottom-right mid grey -> (4, 4, 4)
    t = mean_colour_targets(img, patch=4)
    assert t.shape == (1, 4)
    assert t.tolist() == [[7 * 64, 0, 0, 4 * 64 + 4 * 8 + 4]]
    assert mean_colour_targets(torch.ones(2, 3, 8, 8), patch=4).max().item() == 511


def test_corruption_proportions() -> None:
    mpp = MaskedPatchPrediction(VisionTransformer(**TINY))
    tokens = torch.randn(64, 100, 32)
    out, corrupted = mpp.corrupt(tokens, torch.Generator().manual_seed(0))
    frac = corrupted.float().mean().item()
    assert 0.47 < frac < 0.53
    masked = (out == mpp.mask_token.detach()).all(-1)
    assert not (masked & ~corrupted).any()
    assert 0.77 < masked[corrupted].float().mean().item() < 0.83
    kept = (out == tokens).all(-1)
    assert (kept | corrupted).all()  # untouched patches stay as they are
    assert 0.07 < (kept & corrupted).float().sum().item() / corrupted.sum().item() < 0.13


@pytest.mark.slow
def test_mpp_learns_mean_colour() -> None:
    torch.manual_seed(0)
    vit = VisionTransformer(**TINY, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    mpp = MaskedPatchPrediction(vit)
    opt = torch.optim.AdamW(mpp.parameters(), lr=3e-3)
    # single-colour images: a corrupted patch's colour is given away by its neighbours
    images = torch.rand(16, 3, 1, 1).expand(16, 3, 16, 16).contiguous()
    first = None
    for step in range(30):
        out = mpp(images, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        first = first if first is not None else out.loss.item()
    assert first > 5.5  # ~ln(512) at the start
    assert out.loss.item() < first - 1.5
    assert out.logits.shape[-1] == 512


def test_the_loss_is_over_the_corrupted_patches_and_its_graph_does_not_depend_on_the_draw() -> None:
    """The loss and accuracy are the mean over the corrupted patches (the paper's objective), computed with shapes
    that do not depend on how many were drawn: one graph under ``torch.compile(fullgraph=True)``, so a static
    compilation (``--res-schedule``, a warm start) does not recompile at every batch."""
    torch.manual_seed(0)
    mpp = MaskedPatchPrediction(VisionTransformer(**TINY)).train()
    images = torch.rand(4, 3, 16, 16)
    out = mpp(images, generator=torch.Generator().manual_seed(1))
    pick = out.corrupted
    assert out.logits.shape == (4, 16, 512) and out.targets.shape == (4, 16) and 0 < pick.sum() < 64
    want = torch.nn.functional.cross_entropy(out.logits[pick], out.targets[pick])
    torch.testing.assert_close(out.loss, want, rtol=1e-5, atol=1e-6)
    hits = (out.logits[pick].argmax(-1) == out.targets[pick]).float().mean()
    torch.testing.assert_close(out.accuracy, hits)
    compiled = torch.compile(mpp, backend="eager", fullgraph=True, dynamic=False)
    counts = set()
    for seed in range(3):
        torch.manual_seed(seed)
        counts.add(int(compiled(images).corrupted.sum()))
    assert len(counts) > 1  # different draws, one graph (fullgraph raises at a data-dependent shape)


def test_the_loss_under_bf16_autocast_is_the_mean_over_the_corrupted_patches() -> None:
    """Under bf16 autocast the corrupted patches are still counted exactly (a bf16 count of ~500 is rounded to a
    multiple of 4): the loss is the float32 mean of their cross-entropies."""
    torch.manual_seed(0)
    mpp = MaskedPatchPrediction(VisionTransformer(**TINY)).train()
    images = torch.rand(64, 3, 16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mpp(images, generator=torch.Generator().manual_seed(5))  # 559 corrupted: bf16 says 560
    pick = out.corrupted
    assert pick.sum() > 256
    want = torch.nn.functional.cross_entropy(out.logits[pick].float(), out.targets[pick])
    torch.testing.assert_close(out.loss.float(), want, rtol=2e-4, atol=1e-5)

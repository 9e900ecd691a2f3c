"""Token merging (models/tome.py, Bolya et al. 2023) as an inference option of the ViT: an exact no-op at
r = 0, the shape rules (any grid, any r, cls / gap / map pooling, registers, distillation token), the
merge arithmetic, the prefix tokens never merged, and the speed paths of accel/ standing aside."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import assert_close_rel
from vitlab import accel
from vitlab.errors import ConfigError
from vitlab.models import VisionTransformer, tome

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5)


def randomised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter moved off its initial value (zero head, zero biases would hide mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def images(b: int, h: int = 32, w: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, 3, h, w, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.mark.parametrize(
    "arch",
    [dict(), dict(pool="gap", class_token=False, reg_tokens=2), dict(pool="map", reg_tokens=1), dict(dist_token=True)],
    ids=["cls", "gap-registers", "map", "distilled"],
)
@pytest.mark.parametrize("fast", [False, True], ids=["plain", "accel"])
def test_r0_is_bit_identical(arch, fast):
    model = randomised(VisionTransformer(**TINY, **arch))
    if fast:
        model = accel.accelerate(model)
    x = images(3)
    with torch.no_grad():
        before = model(x)
        merged = model.set_tome(4)(x)
        after = model.set_tome(0)(x)
    assert torch.equal(before, after)
    assert not torch.allclose(before, merged)  # (the option does something when on)


def test_merging_path_without_merges_is_the_block():
    """The block as token merging runs it (its own attention, for the keys and proportional attention)
    computes Eq. 2-3 as Block.forward does, with layer scale and qk-norm too."""
    model = randomised(VisionTransformer(**TINY, init_values=0.5, qk_norm=True, reg_tokens=1))
    z = model.embed(images(2))
    with torch.no_grad():
        want = model.encode(z, model.grid(images(2)))["encoded"]
        got, size = tome.encode(model.blocks, z, r=0, prefix=model.num_prefix_tokens, schedule=[0, 0])
    assert size is None
    assert_close_rel(model.norm(got), want)


def test_prefix_tokens_are_never_merged():
    """One block: attention runs before the merge, so the class, distillation and register tokens leave the
    block exactly as without merging, first and in order."""
    cfg = dict(TINY, depth=1, dist_token=True, reg_tokens=2)
    model = randomised(VisionTransformer(**cfg))
    z = model.embed(images(2))
    with torch.no_grad():
        plain = model.blocks[0](z)
        merged, size = tome.encode(model.blocks, z, r=4, prefix=4)
    assert merged.shape[1] == z.shape[1] - 4
    assert_close_rel(merged[:, :4], plain[:, :4])
    assert torch.equal(size[:, :4], torch.ones(2, 4, 1))


def test_merge_keeps_mass_and_count():
    g = torch.Generator().manual_seed(0)
    x, size = torch.randn(2, 9, 5, generator=g), torch.randint(1, 4, (2, 9, 1), generator=g).float()
    kept, merged, into = tome.bipartite_matching(torch.randn(2, 9, 3, generator=g), 3)
    assert kept.shape == (2, 2) and merged.shape == (2, 3) and into.shape == (2, 3)
    y, ysize = tome.merge_weighted(x, size, kept, merged, into)
    assert y.shape == (2, 6, 5) and ysize.shape == (2, 6, 1)
    torch.testing.assert_close(ysize.sum(1), size.sum(1))  # sizes add up
    torch.testing.assert_close((y * ysize).sum(1), (x * size).sum(1))  # size-weighted sums are kept


def test_merges_the_most_similar_pair():
    """Bipartite soft matching: the A token whose key is closest to a B token is the one merged into it."""
    metric = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [1.0, 0.01]]])  # A = tokens 0, 2; B = 1, 3
    kept, merged, into = tome.bipartite_matching(metric, 1)
    assert merged.tolist() == [[0]] and into.tolist() == [[1]] and kept.tolist() == [[1]]  # token 0 -> token 3


def test_schedule_caps():
    assert tome.merge_schedule(196, 12, 16) == [16] * 11 + [10]  # the paper's ViT-B/16 at r = 16: half of 20 last
    assert tome.merge_schedule(16, 3, 100) == [8, 4, 0]  # half the tokens at most, and at least MIN_TOKENS left
    assert tome.merge_schedule(3, 2, 5) == [0, 0]


@settings(max_examples=25, deadline=None)
@given(
    gh=st.integers(1, 6),
    gw=st.integers(1, 6),
    r=st.integers(0, 20),
    pool=st.sampled_from(["cls", "gap", "map"]),
    regs=st.integers(0, 2),
    batch=st.integers(1, 3),
)
def test_shape_rules(gh, gw, r, pool, regs, batch):
    cfg = dict(TINY, img_size=(4 * gh, 4 * gw), patch_size=4, embed_dim=16, mlp_dim=32, num_heads=2)
    model = randomised(VisionTransformer(**cfg, pool=pool, class_token=pool == "cls", reg_tokens=regs)).set_tome(r)
    x = images(batch, 4 * gh, 4 * gw)
    n, prefix = gh * gw, model.num_prefix_tokens
    schedule = model.tome_schedule()
    assert schedule == tome.merge_schedule(n, 2, r) and all(0 <= k <= r for k in schedule)
    assert n - sum(schedule) >= min(n, tome.MIN_TOKENS)
    with torch.no_grad():
        out = model.encode(model.embed(x), model.grid(x))
        logits = model(x)
    size = out.get("token_size")
    assert out["encoded"].shape == (batch, prefix + n - sum(schedule), 16)
    assert logits.shape == (batch, 5) and torch.isfinite(logits).all()
    if size is not None:
        assert torch.equal(size.sum(1), torch.full((batch, 1), float(n + prefix)))
    assert (size is None) == (sum(schedule) == 0)
    assert model.macs(executed=True) == model.tome_macs() <= model.macs()
    assert (model.tome_macs() == model.macs()) == (size is None)


def test_fewer_macs():
    model = VisionTransformer(**TINY).set_tome(2)
    assert model.macs(executed=True) < model.macs()
    assert accel.accelerate(model).macs(executed=True) == model.tome_macs()


def test_accel_stands_aside():
    """The model-level speed paths (class-token-only last block, batch chunks) would not see the merged
    sequence; with token merging the accelerated model computes what the plain one does."""
    plain = randomised(VisionTransformer(**TINY)).set_tome(3)
    fast = accel.accelerate(copy.deepcopy(plain))
    fast.inference_chunk_bytes = 1  # (would split every batch into single images)
    assert not fast.accelerable(images(4)) and not fast.cls_only_applies()
    with torch.no_grad():
        assert_close_rel(fast(images(4)), plain(images(4)))


def test_refusals():
    with pytest.raises(ConfigError, match="--tome"):
        VisionTransformer(**TINY).set_tome(-1)
    with pytest.raises(ConfigError, match="rotary"):
        VisionTransformer(**TINY, rope=True, posemb="none").set_tome(2)
    with pytest.raises(ConfigError, match="axial"):
        VisionTransformer(**TINY, attention="axial").set_tome(2)
    model = VisionTransformer(**TINY).set_tome(2)
    with pytest.raises(ConfigError, match="every token"):
        model.forward_intermediates(images(1))
    with pytest.raises(ConfigError, match="every token"), model.capture_attention():
        model(images(1))
    assert VisionTransformer(**TINY, rope=True, posemb="none").set_tome(0).tome_r == 0  # off: always allowed

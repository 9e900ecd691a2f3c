"""2-D rotary position embeddings (EVA-02 / DINOv3 style, ``rope=True``): rotations keep norms, q.k
depends on the positions only through their difference, the prefix tokens are not rotated, the model
uses the positions, and the speed paths stand aside."""

from __future__ import annotations

import pytest
import torch

import vitlab
from conftest import assert_close_rel
from vitlab.accel import accelerate
from vitlab.errors import ConfigError
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.models.rope import apply_rope, rope_2d

HD = 16


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_rotation_preserves_norms():
    rows, cols = torch.tensor([0, 1, 5, 7]), torch.tensor([0, 3, 2, 7])
    cos, sin = rope_2d(rows, cols, HD, theta=100.0)
    x = torch.randn(2, 3, 4, HD, generator=_gen(0), dtype=torch.float64)
    y = apply_rope(x, cos.double(), sin.double())
    assert_close_rel(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-6)  # (the table is float32)
    assert not torch.allclose(y[..., 1:, :], x[..., 1:, :])  # (position 0,0 is the identity)


@pytest.mark.parametrize("offset", [(1, 0), (0, 3), (4, -2)])
def test_scores_depend_on_relative_positions_only(offset):
    q = torch.randn(1, 1, 1, HD, generator=_gen(1), dtype=torch.float64)
    k = torch.randn(1, 1, 1, HD, generator=_gen(2), dtype=torch.float64)

    def score(pq, pk):
        cq, sq = (t.double() for t in rope_2d(torch.tensor([pq[0]]), torch.tensor([pq[1]]), HD))
        ck, sk = (t.double() for t in rope_2d(torch.tensor([pk[0]]), torch.tensor([pk[1]]), HD))
        return float((apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum())

    dr, dc = offset
    pq, pk = (2, 5), (6, 1)
    base = score(pq, pk)
    shifted = score((pq[0] + dr, pq[1] + dc), (pk[0] + dr, pk[1] + dc))
    assert abs(shifted - base) <= 1e-5 * abs(base)  # (float32 angles)
    assert abs(score(pq, (pk[0], pk[1] + 1)) - base) > 1e-3 * abs(base)  # the difference itself matters


def test_prefix_tokens_are_not_rotated():
    cos, sin = rope_2d(torch.tensor([1, 2]), torch.tensor([3, 4]), HD)
    x = torch.randn(1, 2, 3, HD, generator=_gen(3))
    y = apply_rope(x, cos, sin)
    assert torch.equal(y[..., :1, :], x[..., :1, :])


def _rope_model(**kw):
    torch.manual_seed(0)
    cfg = ViTConfig(
        name="vit_rope",
        img_size=16,
        patch_size=4,
        embed_dim=32,
        depth=2,
        num_heads=2,
        mlp_dim=64,
        num_classes=5,
        rope=True,
        posemb="none",
        **kw,
    )
    m = VisionTransformer(cfg).eval()
    torch.nn.init.normal_(m.head.weight)
    return m


def test_the_model_sees_patch_positions_through_rope_alone():
    """Without a position table a GAP ViT is invariant to permuting the patches; with RoPE it is not."""
    x = torch.randn(2, 3, 16, 16, generator=_gen(4))
    swapped = torch.cat([x[..., 8:, :], x[..., :8, :]], dim=-2)  # the patch rows reordered
    with torch.no_grad():
        plain = _rope_model(pool="gap", class_token=False)
        plain_cfg = plain.config.replace(rope=False)
        no_rope = VisionTransformer(plain_cfg).eval()
        no_rope.load_state_dict(plain.state_dict())
        assert_close_rel(no_rope(swapped), no_rope(x), rtol=1e-5)
        assert (plain(swapped) - plain(x)).abs().max() > 1e-3
        assert not hasattr(no_rope.blocks[0].attn, "rope")


def test_speed_paths_stand_aside_and_results_match(tmp_path):
    m = _rope_model()
    x = torch.randn(3, 3, 16, 16, generator=_gen(5))
    with torch.no_grad():
        want = m(x)
        fast = accelerate(_rope_model())
        assert not any(b.accelerable() for b in fast.blocks) and not fast.cls_only_applies()
        assert_close_rel(fast(x), want)
    fast.train()
    fast(x).sum().backward()  # the training path too
    path = vitlab.save(m, tmp_path / "m")
    loaded = vitlab.load(path)
    assert loaded.config.rope and loaded.config.rope_theta == 100.0
    with torch.no_grad():
        assert_close_rel(loaded(x), want)


def test_head_width_must_divide_by_four():
    with pytest.raises(ConfigError, match="rope: 2-D RoPE needs a head width divisible by 4"):
        ViTConfig(embed_dim=24, num_heads=4, mlp_dim=48, rope=True)

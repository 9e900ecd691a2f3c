"""Position-embedding resampling (Sec. 3.2) against scipy (official JAX) and timm."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import assert_close_rel
from vitlab.models.posemb import resample_posemb, sincos_2d


def _posemb(grid: tuple[int, int], dim: int = 8, prefix: int = 1, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, prefix + grid[0] * grid[1], dim, generator=g)


@settings(max_examples=30, deadline=None)
@given(
    gh=st.integers(1, 9),
    gw=st.integers(1, 9),
    nh=st.integers(1, 12),
    nw=st.integers(1, 12),
    prefix=st.integers(0, 1),
    mode=st.sampled_from(["jax", "bilinear", "bicubic"]),
)
def test_shape_identity_and_prefix(gh: int, gw: int, nh: int, nw: int, prefix: int, mode: str) -> None:
    pe = _posemb((gh, gw), prefix=prefix)
    out = resample_posemb(pe, (nh, nw), old_grid=(gh, gw), num_prefix_tokens=prefix, mode=mode)
    assert out.shape == (1, prefix + nh * nw, 8)
    assert torch.equal(out[:, :prefix], pe[:, :prefix])
    same = resample_posemb(pe, (gh, gw), old_grid=(gh, gw), num_prefix_tokens=prefix, mode=mode)
    assert torch.equal(same, pe)


@settings(max_examples=30, deadline=None)
@given(gh=st.integers(2, 8), gw=st.integers(2, 8), nh=st.integers(2, 14), nw=st.integers(2, 14))
def test_jax_mode_matches_scipy_zoom_order1(gh: int, gw: int, nh: int, nw: int) -> None:
    ndimage = pytest.importorskip("scipy.ndimage")
    pe = _posemb((gh, gw), dim=4, prefix=1)
    out = resample_posemb(pe, (nh, nw), old_grid=(gh, gw), mode="jax")
    grid = pe[0, 1:].reshape(gh, gw, 4).double().numpy()
    ref = ndimage.zoom(grid, (nh / gh, nw / gw, 1), order=1)
    assert ref.shape == (nh, nw, 4)
    # 3e-6: the sample positions are float32 (error ~ grid size x 6e-8, times neighbour differences up to twice
    # the largest value) against scipy's float64; 8e-7 measured over all grids up to 8 x 8 -> 14 x 14
    assert_close_rel(out[0, 1:].reshape(nh, nw, 4), ref, rtol=3e-6)
    # corners are preserved exactly in this mode
    for r, c in ((0, 0), (0, -1), (-1, 0), (-1, -1)):
        assert_close_rel(out[0, 1:].reshape(nh, nw, 4)[r, c], grid[r, c], rtol=1e-6)


@pytest.mark.parametrize(("old", "new"), [((14, 14), (24, 24)), ((7, 7), (4, 4)), ((6, 6), (8, 10))])
def test_bicubic_mode_matches_timm(old: tuple[int, int], new: tuple[int, int]) -> None:
    pos_embed = pytest.importorskip("timm.layers.pos_embed")
    pe = _posemb(old, dim=16)
    ours = resample_posemb(pe, new, old_grid=old, mode="bicubic")
    ref = pos_embed.resample_abs_pos_embed(
        pe, new_size=list(new), old_size=list(old), num_prefix_tokens=1, interpolation="bicubic", antialias=True
    )
    assert_close_rel(ours, ref, rtol=1e-6)


def test_infers_square_grid_and_rejects_non_square() -> None:
    pe = _posemb((4, 4))
    assert resample_posemb(pe, 6).shape == (1, 37, 8)
    with pytest.raises(ValueError, match="do not form a square grid"):
        resample_posemb(_posemb((3, 5)), 6)


def test_sincos_2d_is_bounded_and_distinct() -> None:
    pe = sincos_2d(5, 7, 32)
    assert pe.shape == (35, 32)
    assert pe.abs().max() <= 1.0
    assert torch.cdist(pe, pe).add(torch.eye(35) * 10).min() > 1e-3  # every position has its own code
    # first quarter encodes the column (x), third the row (y)
    assert torch.equal(pe[0, :8], pe[7, :8]) and not torch.equal(pe[0, 16:24], pe[7, 16:24])

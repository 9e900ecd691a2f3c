"""The packing data pipeline (data/pipeline/navit.py): native-aspect grids within a token budget, a resolution drawn per
image, greedy packing into fixed-length sequences; deterministic per (seed, epoch), resumable from a batch's
``next_position``, every image of the epoch once, no image split, padding accounted; over a decode cache of
photos at their aspect ratio and over tar shards, in DataLoader workers or not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from vitlab.data import load_data
from vitlab.data.images.rows import PackedImages
from vitlab.data.pipeline.navit import (
    KeptBytes,
    Patchify,
    SequenceBatches,
    SizedImages,
    native_grid,
    pack_batches,
    token_budget,
)
from vitlab.data.pipeline.seeding import item_seed, seeded
from vitlab.data.shards.source import open_source
from vitlab.data.shards.stream import EpochOrder
from vitlab.data.shards.write import pack_folder
from vitlab.data.sources import FolderStorage
from vitlab.errors import ConfigError, DataError
from vitlab.models.packed import pack

SHAPES = [(30, 40), (40, 30), (24, 64), (48, 48), (64, 20), (36, 27), (20, 20), (56, 42)]


def photo_folder(root: Path, *, per_class: int = 6) -> Path:
    """``root/{train,test}/class{0,1,2}/NN.png`` of several aspect ratios (portrait, landscape, square, strips)."""
    rng = np.random.default_rng(0)
    k = 0
    for split, n in (("train", per_class), ("test", 2)):
        for c in range(3):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                h, w = SHAPES[k % len(SHAPES)]
                k += 1
                arr = rng.integers(0, 80, (h, w, 3)).astype(np.uint8)
                arr[..., c] += 150
                Image.fromarray(arr).save(d / f"{i:02d}.png")
    return root


class Split:
    """What ``load_data`` returns per split: images and labels."""

    def __init__(self, images, labels) -> None:
        self.images, self.labels = images, np.asarray(labels, dtype=np.int64)


def synthetic(n: int = 40, seed: int = 0) -> Split:
    rng = np.random.default_rng(seed)
    shapes = [SHAPES[i % len(SHAPES)] for i in range(n)]
    data = np.concatenate([rng.integers(0, 256, h * w * 3).astype(np.uint8) for h, w in shapes])
    images = PackedImages(data, heights=[h for h, _ in shapes], widths=[w for _, w in shapes], chans=3)
    return Split(images, np.arange(n) % 3)


def patchify(**kw) -> Patchify:
    return Patchify(**{"patch_size": 8, "resolution": (16, 48), "mean": (0.5,) * 3, "std": (0.5,) * 3, **kw})


def loader(source, **kw) -> SequenceBatches:
    pf = kw.pop("patchify", None) or patchify(hflip=0.5)
    return SequenceBatches(
        **{"source": source, "patchify": pf, "pack_len": 64, "sequences": 3, "prefix_tokens": 1, **kw}
    )


def same(a, b) -> bool:
    """Two lists of batches are equal tensor for tensor."""
    if len(a) != len(b):
        return False
    fields = ("patches", "image_ids", "rows", "cols", "grids")
    return all(
        x.next_position == y.next_position
        and torch.equal(x.labels, y.labels)
        and torch.equal(x.positions, y.positions)
        and all(torch.equal(getattr(x.packed, f), getattr(y.packed, f)) for f in fields)
        for x, y in zip(a, b, strict=True)
    )


def check_epoch(batches, n: int, *, pack_len: int = 64, prefix: int = 1) -> None:
    """Every position 0..n-1 once, each batch a contiguous run of them up to its ``next_position`` (images in the
    order of the sequences they were put in); each image inside one sequence; padding counted right."""
    start = 0
    for b in batches:
        assert sorted(b.positions.tolist()) == list(range(start, b.next_position))
        start = b.next_position
    assert start == n
    for b in batches:
        ids = b.packed.image_ids
        assert ids.shape == (3, pack_len)
        n_img = b.packed.num_images
        seq_of = [set(torch.nonzero(ids == i)[:, 0].tolist()) for i in range(n_img)]
        assert all(len(s) == 1 for s in seq_of), "an image split across sequences"
        tokens = int((b.packed.rows >= 0).sum()) + prefix * n_img
        assert tokens + int((ids < 0).sum()) == ids.numel()
        assert b.padding == pytest.approx(int((ids < 0).sum()) / ids.numel())


@settings(max_examples=60, deadline=None)
@given(h=st.integers(1, 4000), w=st.integers(1, 4000), budget=st.integers(1, 1024), p=st.sampled_from([4, 8, 16]))
def test_native_grid_keeps_the_aspect_ratio_within_the_budget(h, w, budget, p):
    gh, gw = native_grid(h, w, patch_size=p, max_tokens=budget)
    assert gh >= 1 and gw >= 1 and gh * gw <= budget
    if min(gh, gw) >= 4:  # (a strip's short side is clamped to one patch) the shape is the image's, to a patch
        assert abs(gh / gw - h / w) <= (h / w) * (1 / gw + 1 / gh) * 1.01 + 1e-9
        assert (gh + 1) * (gw + 1) > budget  # and as large as the budget allows


def test_native_grid_examples():
    assert native_grid(224, 224, patch_size=16, max_tokens=196) == (14, 14)
    assert native_grid(4000, 3000, patch_size=16, max_tokens=196) == (16, 12)  # a 4:3 photo at 224's budget
    assert native_grid(1080, 1920, patch_size=16, max_tokens=196) == (10, 18)
    assert native_grid(10, 5000, patch_size=16, max_tokens=196) == (1, 196)
    assert token_budget(224, 16) == 196 and token_budget(223.9, 16) == 195


def test_patchify_draws_per_image_and_keeps_the_grid():
    img = np.random.default_rng(0).integers(0, 256, (30, 40, 3)).astype(np.uint8)
    pf = patchify(resolution=(32, 32))
    t = pf(img)
    assert t.grid == (3, 4) and t.patches.shape == (12, 192)
    assert t.rows.tolist() == [0] * 4 + [1] * 4 + [2] * 4 and t.cols.tolist() == [0, 1, 2, 3] * 3
    sides = set()
    for s in range(20):
        torch.manual_seed(s)
        sides.add(patchify()(img).grid)
    assert len(sides) > 3  # the resolution is drawn per image


def test_a_random_crop_keeps_the_images_aspect_ratio():
    img = np.random.default_rng(0).integers(0, 256, (48, 96, 3)).astype(np.uint8)  # 1:2
    pf = patchify(resolution=(32, 32), crop_scale=(0.25, 0.6))
    grids = set()
    for s in range(12):
        torch.manual_seed(s)
        t = pf(img)
        grids.add(t.grid)
        assert t.grid[1] >= 2 * t.grid[0] - 1  # still about twice as wide as high (no ratio jitter)
    assert len(grids) >= 1
    torch.manual_seed(0)
    whole = patchify(resolution=(32, 32))(img)
    torch.manual_seed(0)
    cropped = pf(img)
    assert not torch.equal(whole.patches, cropped.patches)  # another part of the picture
    with pytest.raises(ConfigError, match="crop: scale"):
        patchify(crop_scale=(0.5, 1.2))


def test_token_dropping_keeps_a_seeded_subset_of_each_images_patches():
    src = synthetic(12)
    full = list(loader(src, seed=1, epoch=2))
    dropped = list(loader(src, seed=1, epoch=2, token_drop=0.5))
    assert same(dropped, list(loader(src, seed=1, epoch=2, token_drop=0.5)))

    def images(batches):
        out = {}
        for b in batches:
            p = b.packed
            for i, pos in enumerate(b.positions.tolist()):
                m = (p.image_ids == i) & (p.rows >= 0)
                out[pos] = (p.rows[m].tolist(), p.cols[m].tolist(), p.patches[m], tuple(p.grids[i].tolist()))
        return out

    a, b = images(dropped), images(full)
    assert a.keys() == b.keys() == set(range(12))
    for pos, (rows, cols, x, grid) in a.items():
        r0, c0, x0, g0 = b[pos]
        assert grid == g0 and len(rows) == max(1, int(len(r0) * 0.5))
        where = {(r, c): k for k, (r, c) in enumerate(zip(r0, c0))}
        for r, c, patch in zip(rows, cols, x):
            assert torch.equal(patch, x0[where[(r, c)]])  # the same patches as undropped, a subset of them


def test_a_packed_batch_is_normalised_at_once_to_each_images_own_normalised_patches():
    """The loaders pack uint8 patches and normalise the batch in one call: every patch token holds exactly what
    ``Patchify`` gives the image alone (float normalised patches), prefix slots and padding stay zero."""
    src = synthetic(12)
    pf = patchify(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), hflip=0.5, crop_scale=(0.5, 1.0))
    batches = list(loader(src, patchify=pf, seed=2, epoch=1, prefix_tokens=2, token_drop=0.25))
    for b in batches:
        p = b.packed
        assert p.patches.dtype == torch.float32 and not p.patches[p.rows < 0].any()
        for i, pos in enumerate(b.positions.tolist()):
            i_src = int(EpochOrder([12], seed=2, epoch=1, window=12).offsets(np.asarray([pos]))[0])
            with seeded(item_seed(2, 1, pos)):
                own = pf(src.images[i_src])  # the image alone, normalised by Patchify itself
            m = (p.image_ids == i) & (p.rows >= 0)
            where = {(r, c): k for k, (r, c) in enumerate(zip(own.rows.tolist(), own.cols.tolist()))}
            idx = [where[(r, c)] for r, c in zip(p.rows[m].tolist(), p.cols[m].tolist())]
            assert torch.equal(p.patches[m], own.patches[idx])  # bit for bit
    images = [pf.sized(src.images[i]).float() for i in range(4)]  # float pixels, sized once
    with seeded(0):  # the same flips for both
        own = pack([[pf.finish(x)] for x in images], seq_len=64, prefix_tokens=2)  # each normalised by finish itself
    with seeded(0):
        raw = pack([[pf.finish(x, normalise=False)] for x in images], seq_len=64, prefix_tokens=2)
    assert torch.equal(pf.normalise_packed(raw).patches, own.patches)  # normalised like finish's, not passed through


def test_an_epoch_is_every_image_once_deterministic_and_packed_greedily():
    src = synthetic()
    batches = list(loader(src, seed=3, epoch=1))
    check_epoch(batches, 40)
    assert same(batches, list(loader(src, seed=3, epoch=1)))
    other = list(loader(src, seed=3, epoch=2))
    check_epoch(other, 40)
    labels = torch.cat([b.labels for b in batches])
    assert not torch.equal(labels, torch.cat([b.labels for b in other]))  # another epoch: another order
    assert sorted(labels.tolist()) == sorted(src.labels.tolist())
    for b in batches[:-1]:  # a batch closes only when the next image fits in none of its sequences
        free = (b.packed.image_ids < 0).sum(dim=1)
        nxt = next(x for x in batches if int(x.positions.min()) == b.next_position)
        first = int((nxt.packed.image_ids == 0).sum())  # the image that did not fit opens the next batch
        assert nxt.positions[0] == b.next_position and int(free.max()) < first


def test_padding_fraction_is_accounted():
    src = synthetic()
    ld = loader(src)
    batches = list(ld)
    assert ld.num_images == 40
    slots = sum(b.packed.image_ids.numel() for b in batches)
    padded = sum(int((b.packed.image_ids < 0).sum()) for b in batches)
    assert ld.padding_fraction == pytest.approx(padded / slots)
    assert 0 < ld.padding_fraction < 0.5


@pytest.mark.parametrize("k", [0, 1, -1], ids=["first", "second", "last"])
def test_resuming_at_a_batch_position_gives_exactly_the_batches_that_followed(k):
    src = synthetic()
    ref = list(loader(src, seed=7, epoch=4, pack_len=40))
    assert len(ref) > 3
    k = k % len(ref)
    rest = list(loader(src, seed=7, epoch=4, pack_len=40, start=ref[k].next_position))
    assert same(rest, ref[k + 1 :])


def test_workers_make_the_same_batches():
    src = synthetic(24)
    assert same(list(loader(src, workers=2, chunk=5)), list(loader(src, workers=0)))


def test_evaluation_order_has_no_random_draws():
    src = synthetic(12)
    pf = patchify(resolution=(32, 32))
    a = list(loader(src, shuffle=False, patchify=pf))
    torch.manual_seed(123)
    b = list(loader(src, shuffle=False, patchify=pf))
    assert same(a, b)
    assert torch.cat([x.labels for x in a]).tolist() == src.labels.tolist()


def test_kept_resized_images_give_the_same_batches_in_every_epoch():
    src = synthetic(24)
    pf = patchify(resolution=(32, 32), hflip=0.5)
    assert (
        pf.fixed_size
        and not patchify().fixed_size
        and not patchify(resolution=(32, 32), crop_scale=(0.5, 1)).fixed_size
    )
    sized = SizedImages(src.images, pf)
    for epoch in (0, 1, 2):  # the first epoch resizes and keeps, the next ones read what was kept
        kept = list(loader(src, patchify=pf, epoch=epoch, sized=sized))
        assert same(kept, list(loader(src, patchify=pf, epoch=epoch)))
        assert len(sized.kept) == 24
    first = sized.kept[0]
    assert torch.equal(first, pf.sized(src.images[0])) and sized[0] is first
    one = first.numel()
    capped = SizedImages(src.images, pf, keep_bytes=3 * one)  # room for about three: the rest is resized each time
    list(loader(src, patchify=pf, sized=capped))
    assert 1 <= len(capped.kept) <= 3 and capped.budget.left >= 0
    shared = KeptBytes(5 * one)  # one cap for two splits: what the first keeps, the second cannot
    a, b = SizedImages(src.images, pf, keep_bytes=shared), SizedImages(src.images, pf, keep_bytes=shared)
    for s in (a, b):
        assert same(list(loader(src, patchify=pf, sized=s)), list(loader(src, patchify=pf)))
    kept = sum(x.numel() for s in (a, b) for x in s.kept.values())
    assert len(a.kept) >= 1 and kept <= 5 * one and shared.left == 5 * one - kept
    drawn = SizedImages(src.images, patchify(hflip=0.5))  # a resolution drawn per image: nothing is kept
    assert same(list(loader(src, patchify=drawn.patchify, sized=drawn)), list(loader(src, patchify=drawn.patchify)))
    assert not drawn.kept and not drawn.keeps and sized.keeps and not SizedImages(src.images, pf, keep_bytes=0).keeps
    with pytest.raises(ConfigError, match="another Patchify"):
        loader(src, patchify=patchify(resolution=(32, 32)), sized=sized)


def test_pack_len_must_hold_the_largest_image():
    with pytest.raises(ConfigError, match="--pack-len 36: an image may take 37 tokens"):
        loader(synthetic(), pack_len=36)
    samples = iter([])
    assert list(pack_batches(samples, pack_len=10, sequences=2, prefix_tokens=1)) == []


def test_a_cached_folder_of_photos_packs_at_their_aspect_ratio(tmp_path):
    folder = photo_folder(tmp_path / "photos")
    plan = FolderStorage(size=None, store_side=None)
    splits = load_data(str(folder), cache_dir=tmp_path / "cache", storage=plan, progress=False, workers=0)
    assert isinstance(splits.train.images, PackedImages)
    pf = patchify(resolution=(32, 32))
    batches = list(loader(splits.train, patchify=pf, pack_len=40, shuffle=False))
    check_epoch(batches, 18, pack_len=40)
    grids = [tuple(g) for b in batches for g in b.packed.grids.tolist()]
    heights, widths = splits.train.images.heights, splits.train.images.widths
    assert grids == [native_grid(int(h), int(w), patch_size=8, max_tokens=16) for h, w in zip(heights, widths)]
    assert {(3, 4), (4, 3), (4, 4)} <= set(grids)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("packshards")
    folder = photo_folder(root / "photos", per_class=7)
    one = (folder / "train" / "class0" / "00.png").stat().st_size
    pack_folder(folder, root / "shards", shard_bytes=3 * one, progress=False)
    return open_source(str(root / "shards")).train


def test_tar_shards_pack_every_sample_once_and_resume(shards):
    assert len(shards) == 21 and len(shards.shards) > 3
    kw = dict(num_classes=3, seed=2, epoch=1, chunk=4)
    ref = list(loader(shards, **kw))
    check_epoch(ref, 21)
    assert same(list(loader(shards, workers=2, **kw)), ref)
    assert same(list(loader(shards, start=ref[1].next_position, **kw)), ref[2:])


def test_a_sample_that_cannot_be_prepared_is_one_line_naming_it(shards):
    def broken(x):
        raise ValueError("no such augmentation")

    ld = loader(shards, num_classes=3, patchify=patchify(augment=broken))
    with pytest.raises(DataError, match=r"\.tar: .*cannot decode \(ValueError: no such augmentation\)"):
        list(ld)


def test_batches_of_a_fixed_number_of_images_pack_largest_first():
    src = synthetic(23)
    kw = dict(seed=4, epoch=1, sequences=None, images=5, pack_len=40)
    batches = list(loader(src, **kw))
    assert [b.packed.num_images for b in batches] == [5, 5, 5, 5, 3]
    assert [b.next_position for b in batches] == [5, 10, 15, 20, 23]
    start = 0
    for b in batches:
        assert sorted(b.positions.tolist()) == list(range(start, b.next_position))
        start = b.next_position
        ids = b.packed.image_ids
        n = b.packed.num_images
        sizes = [int((ids == i).sum()) for i in range(n)]
        seq_of = [int(torch.nonzero(ids == i)[0, 0]) for i in range(n)]
        free, want = [], {}  # first fit decreasing, by hand: each image into the first sequence with room
        for i in sorted(range(n), key=lambda i: -sizes[i]):
            j = next((j for j, f in enumerate(free) if f >= sizes[i]), len(free))
            free += [40] if j == len(free) else []
            free[j] -= sizes[i]
            want[i] = j
        assert seq_of == [want[i] for i in range(n)] and ids.shape[0] == len(free)
    assert same(list(loader(src, start=10, **kw)), batches[2:])


def test_processes_take_disjoint_shares_and_every_image_once():
    src = synthetic(26)
    kw = dict(seed=4, epoch=3, sequences=None, images=3, pack_len=40, stop=24)
    ranks = [list(loader(src, rank=r, world=2, **kw)) for r in range(2)]
    assert [len(b) for b in ranks] == [4, 4]  # 24 positions, 3 images a batch on each of 2 processes
    seen = [p for batches in ranks for b in batches for p in b.positions.tolist()]
    assert sorted(seen) == list(range(24))  # positions 24 and 25: past the stop
    for r, batches in enumerate(ranks):
        for k, b in enumerate(batches):
            assert sorted(b.positions.tolist()) == [r + 2 * i for i in range(3 * k, 3 * k + 3)]
            assert b.next_position == (k + 1) * 6
    # a resumed pair of processes starts at a batch boundary of both
    resumed = [list(loader(src, rank=r, world=2, start=12, **kw)) for r in range(2)]
    assert all(same(resumed[r], ranks[r][2:]) for r in range(2))
    one = list(loader(src, **{**kw, "images": 6}))  # the same images by step as one process taking both shares
    assert [sorted(b.positions.tolist()) for b in one] == [
        sorted(x.positions.tolist() + y.positions.tolist()) for x, y in zip(*ranks, strict=True)
    ]


def test_shards_split_over_processes(shards):
    kw = dict(num_classes=3, seed=2, epoch=1, chunk=2, sequences=None, images=2, stop=20)
    ranks = [list(loader(shards, rank=r, world=2, **kw)) for r in range(2)]
    seen = sorted(p for batches in ranks for b in batches for p in b.positions.tolist())
    assert seen == list(range(20))
    assert same(list(loader(shards, rank=1, world=2, workers=2, **kw)), ranks[1])

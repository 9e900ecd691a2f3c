"""The shard reader (:mod:`vitlab.data.shards.stream`): one global order per epoch, split over ranks and workers,
resumable on another number of processes, in bounded memory."""

from __future__ import annotations

import io
import shutil
import tracemalloc

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from imagefolder import tiny_folder
from vitlab.data.shards import write as shards_mod
from vitlab.data.shards.source import open_source
from vitlab.data.shards.stream import EpochOrder, ShardStream, StreamBatches, open_stream_data
from vitlab.data.shards.write import pack_folder
from vitlab.errors import DataError


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """45 train samples (15 a class) in shards of about 4 samples, and 6 test samples."""
    root = tmp_path_factory.mktemp("stream")
    folder = tiny_folder(root / "rgb", per_class=15, test_per_class=2)
    one = (folder / "train" / "class0" / "00.png").stat().st_size
    pack_folder(folder, root / "packed", shard_bytes=4 * one, progress=False)
    return root / "packed"


def nbytes(data: bytes) -> torch.Tensor:
    """A stand-in transform: the reader's logic without decoding."""
    return torch.tensor([len(data)])


def stream(shards, **kw) -> ShardStream:
    return ShardStream(shards=shards, transform=nbytes, out_shape=(1,), num_classes=3, **kw)


def read(shards, *, world=1, workers=0, batch=3, **kw) -> dict[int, str]:
    """position -> key of every sample each rank's DataLoader yields, checking that each rank's batches come in
    order and that every global micro-batch (``batch`` x ``world`` samples) is the next run of positions."""
    got: dict[int, str] = {}
    per_rank = []
    for rank in range(world):
        ds = stream(shards, rank=rank, world=world, batch=batch, **kw)
        batches = list(DataLoader(ds, batch_size=batch, num_workers=workers))
        assert sum(len(b[0]) for b in batches) == len(ds)
        per_rank.append(batches)
        for _, _, keys, pos, err in batches:
            assert not any(err)
            for p, k in zip(pos.tolist(), keys, strict=True):
                assert p not in got, f"position {p} read twice"
                got[p] = k
    start = kw.get("start", 0)
    for m in range(min(len(b) for b in per_rank)):  # micro-batch m of all ranks: positions start + m*batch*world ...
        pos = sorted(p for b in per_rank for p in b[m][3].tolist())
        assert pos == list(range(start + m * batch * world, start + (m + 1) * batch * world))
    return got


def test_epoch_order_is_a_seeded_permutation_shuffled_within_windows():
    counts = [5, 7, 3, 9, 1]
    n = sum(counts)
    orders = []
    for epoch in (0, 1):
        o = EpochOrder(counts, seed=3, epoch=epoch, window=6)
        offs = np.concatenate([o.offsets(np.arange(w, min(w + 6, n))) for w in range(0, n, 6)])
        assert sorted(offs.tolist()) == list(range(n))  # each sample once
        assert all(p // 6 == off // 6 for p, off in enumerate(offs))  # moved only within its window
        assert [o.position(int(off)) for off in offs] == list(range(n))
        orders.append(offs.tolist())
    assert orders[0] != orders[1]  # another shuffle each epoch
    again = EpochOrder(counts, seed=3, epoch=1, window=6)
    assert again.offsets(np.arange(6)).tolist() == orders[1][:6]  # seeded by seed and epoch
    assert EpochOrder(counts, seed=3, epoch=0, window=6, shuffle=False).offsets(np.arange(6)).tolist() == list(range(6))


def test_every_sample_once_per_epoch_in_one_order_whatever_ranks_and_workers(packed):
    shards = open_source(str(packed)).train
    assert len(shards) == 45 and len(shards.shards) > 5
    ref = read(shards, epoch=1, window=8)
    assert sorted(ref) == list(range(45)) and len(set(ref.values())) == 45
    split = read(shards, world=2, workers=2, batch=3, epoch=1, window=8, stop=42)  # 7 global steps of 6
    assert split == {p: ref[p] for p in range(42)}
    assert read(shards, epoch=2, window=8) != ref  # the next epoch: another order


@pytest.mark.parametrize(("world", "workers"), [(2, 0), (1, 2), (3, 0)])
def test_resume_after_k_samples_reads_exactly_the_rest(packed, world, workers):
    shards = open_source(str(packed)).train
    ref = read(shards, epoch=0, window=8, stop=36)
    done = 12  # consumed by two processes with micro-batches of 3: two global steps
    rest = read(shards, world=world, workers=workers, batch=2, epoch=0, window=8, start=done, stop=36)
    assert rest == {p: ref[p] for p in range(done, 36)}
    assert sorted({ref[p] for p in range(done)} | set(rest.values())) == sorted(ref.values())


def test_memory_stays_within_the_shuffle_window(tmp_path):
    """A data set of ~2 MB read with a 16-sample window: the reader never holds more than about a window of it."""
    rng = np.random.default_rng(0)
    for c in range(2):
        d = tmp_path / "src" / f"c{c}"
        d.mkdir(parents=True)
        for i in range(80):  # noise PNGs do not compress: ~12 kB each
            Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(d / f"{i}.png")
    pack_folder(tmp_path / "src", tmp_path / "packed", shard_bytes=200_000, progress=False)
    shards = open_source(str(tmp_path / "packed"), val_split=0.2).train
    total = sum(s.samples for s in shards.shards) * 12_400

    def peak(window: int, shuffle: bool = True) -> int:
        tracemalloc.start()
        n = sum(1 for _ in stream(shards, window=window, batch=4, shuffle=shuffle))
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert n == len(shards)
        return top

    assert total > 1_500_000
    assert peak(16) < 0.2 * total  # 16 samples ~ 200 kB (plus one member being read)
    assert peak(16, shuffle=False) < 0.2 * total  # evaluation's order too
    assert peak(len(shards)) > 0.8 * total  # the measurement sees the buffer: a window of everything holds everything


def test_a_pattern_a_manifest_free_copy_and_a_url_read_the_same_samples(packed, tmp_path):
    train = open_source(str(packed)).train
    names = sorted(s.url.rsplit("/", 1)[-1] for s in train.shards)
    last = len(names) - 1
    pattern = f"{packed}/train-{{000000..{last:06d}}}.tar"
    src = open_source(pattern)
    assert src.train.counts == train.counts and src.classes == ["class0", "class1", "class2"]
    assert src.val_name == "test" and len(src.val) == 6
    for n in names:  # no manifest: counted from the tar headers, classes named by index
        shutil.copy(packed / n, tmp_path / n)
    bare = open_source(f"{tmp_path}/train-{{000000..{last:06d}}}.tar", val_split=0.2)
    assert bare.classes == ["0", "1", "2"] and len(bare.train) + len(bare.val) == 45
    ref = read(train, epoch=0, window=8)
    pipe = f"pipe:cat {packed}/train-{{000000..{last:06d}}}.tar"
    with pytest.raises(DataError, match="--allow-pipe"):  # a shell command: only when the caller says it was typed
        open_source(pipe)
    piped = open_source(pipe, allow_pipe=True)  # streamed through webdataset.gopen
    assert piped.train.counts == train.counts
    assert read(piped.train, world=2, batch=2, epoch=0, window=8) == ref
    with pytest.raises(DataError, match="missing"):
        open_source(f"{packed}/train-{{000000..{last + 1:06d}}}.tar")
    with pytest.raises(DataError, match="one split"):
        open_source(f"{packed}/{{train-000000,test-000000}}.tar")


def test_stream_data_and_a_bad_sample(packed, tmp_path, monkeypatch):
    data = open_stream_data(str(packed))
    assert (len(data.train), len(data.val), data.num_classes, data.image_size) == (45, 6, 3, (8, 8))
    assert open_stream_data(str(packed), eval_only=True).val_name == "test"
    bad = tmp_path / "bad"
    tiny_folder(bad, per_class=2, test_per_class=1)
    (bad / "train" / "class1" / "00.png").write_bytes(b"not an image")
    # vitlab data pack leaves such a file out (tests/test_reliability_shards.py); shards from elsewhere may hold one
    monkeypatch.setattr(shards_mod, "_checked", lambda *a, **k: "")
    pack_folder(bad, tmp_path / "packed", progress=False)
    from vitlab.data.shards.stream import EvalDecode

    decode = EvalDecode(at_least=(8, 8), in_chans=3, tf=lambda x: x.float())
    ds = ShardStream(
        shards=open_source(str(tmp_path / "packed")).train, transform=decode, out_shape=(3, 8, 8), num_classes=3
    )
    with pytest.raises(DataError, match=r"train\d+: cannot decode \(UnidentifiedImageError") as e:
        list(StreamBatches(DataLoader(ds, batch_size=2)))
    assert "train/class1/00.png/train" in str(e.value)  # the sample's key names its source file


def test_decoding_a_crop_at_a_reduced_jpeg_scale_matches_the_full_decode():
    from torchvision.transforms.v2 import functional as TF

    from vitlab.data.images.decode import decode_encoded

    y, x = np.mgrid[0:384, 0:512]
    img = np.stack([x / 2, y / 1.5, (x + y) / 4], -1).astype(np.uint8)  # smooth: downscaling loses little
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=95)
    box = (64, 32, 448, 352)
    small = decode_encoded(buf.getvalue(), region=lambda w, h: box, at_least=(32, 32))
    assert small.shape == (40, 48, 3)  # 1/8 of the 384 x 320 box: the smallest scale that keeps >= 32 px
    full = decode_encoded(buf.getvalue())[box[1] : box[3], box[0] : box[2]]
    t = TF.resize(torch.from_numpy(full.copy()).permute(2, 0, 1), [40, 48], antialias=True).permute(1, 2, 0)
    assert np.abs(t.numpy().astype(int) - small.astype(int)).mean() < 0.02 * 255

    turbo = decode_encoded(buf.getvalue(), region=lambda w, h: box, at_least=(300, 300), jpeg_turbo=True)
    assert turbo.shape == (320, 384, 3)  # no DCT scale keeps 300 px: decoded whole by libjpeg-turbo, then cut
    assert np.abs(turbo.astype(int) - full.astype(int)).mean() < 0.01 * 255  # PIL's pixels within a level or two


def test_kept_decode_gives_the_folders_stored_pixels_and_decodes_each_sample_once(tmp_path, monkeypatch):
    """With a storage, a shard sample is decoded as the decode cache stores a folder's file (its shorter side at most
    the storage's, aspect kept: the same pixels), then the folder's transform; a sample seen again is not decoded
    again (kept in this process, up to its budget; a worker's pickled copy starts empty)."""
    import pickle

    from vitlab.data.images.decode import decode_image
    from vitlab.data.shards import stream as stream_mod
    from vitlab.data.shards.stream import KeptDecode

    arr = np.random.default_rng(0).integers(0, 256, (60, 90, 3), dtype=np.uint8)
    path = tmp_path / "photo.jpg"
    Image.fromarray(arr).save(path, quality=90)
    data = path.read_bytes()
    calls = []
    real = stream_mod.decode_encoded
    monkeypatch.setattr(stream_mod, "decode_encoded", lambda *a, **k: calls.append(1) or real(*a, **k))
    kept = KeptDecode(store_side=24, in_chans=3, tf=torch.clone)
    want = torch.from_numpy(decode_image(path, shorter_side=24)).permute(2, 0, 1)
    assert want.shape == (3, 24, 36)
    assert torch.equal(kept(data), want) and torch.equal(kept(data), want) and len(calls) == 1
    fresh = pickle.loads(pickle.dumps(kept))
    assert torch.equal(fresh(data), want) and len(calls) == 2  # the copy decoded it itself
    none = KeptDecode(store_side=24, in_chans=3, tf=torch.clone, keep_bytes=0)
    none(data), none(data)
    assert len(calls) == 4


def test_kept_batches_replay_the_first_evaluation_within_their_budget():
    from vitlab.data.shards.stream import KeptBatches

    class Loader:
        def __init__(self, fail: bool = False) -> None:
            self.passes, self.fail = 0, fail

        def __len__(self) -> int:
            return 3

        def __iter__(self):
            self.passes += 1
            for i in range(3):
                if self.fail and self.passes == 1 and i == 2:
                    raise DataError("broken sample")
                yield torch.full((2, 4), float(i)), torch.tensor([i, i])

    loader = Loader()
    kept = KeptBatches(loader)
    first, again = list(kept), list(kept)
    assert loader.passes == 1 and len(again) == 3 and all(torch.equal(a[0], b[0]) for a, b in zip(first, again))
    small = KeptBatches(Loader(), keep_bytes=2 * (2 * 4 * 4 + 2 * 8))  # two of the three batches: none kept
    list(small), list(small)
    assert small.loader.passes == 2
    broken = KeptBatches(Loader(fail=True))
    with pytest.raises(DataError):
        list(broken)
    assert len(list(broken)) == 3 and broken.loader.passes == 2  # the failed pass kept nothing

"""The decode cache heals: a full disk is one line before any decoding, a damaged cache is found,
named, deleted and decoded again (never trained on), and concurrent writers never share a temp file."""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
import threading
from collections import namedtuple

import numpy as np
import pytest
from PIL import Image

from vitlab.cli import main
from vitlab.data.cache import store as cache_mod
from vitlab.data.cache.store import CacheError, decode_files

N = 10


def make_images(d, n=N):
    """``n`` 8x8 PNGs, each different, so a wrong or shuffled row shows."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        p = d / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    return paths


def build(paths, cache, **kw):
    return decode_files(paths, cache_dir=cache, progress=False, workers=1, **kw)


def files(cache):
    """The cache's file names: the data, the metadata and any temp file left behind."""
    return sorted(p.name for p in cache.iterdir())


def one_file(cache, suffix):
    (f,) = cache.glob(f"*{suffix}")
    return f


@pytest.fixture
def small_chunks(monkeypatch):
    """Three images per checksum, so a 10-image cache has four chunks."""
    monkeypatch.setattr(cache_mod, "CHUNK_BYTES", 3 * 8 * 8 * 3)


def fake_disk_usage(free):
    usage = namedtuple("usage", "total used free")
    return lambda path: usage(10**9, 10**9 - free, free)


def test_full_disk_is_one_line_before_any_decoding(tmp_path, monkeypatch, capsys):
    paths = make_images(tmp_path / "data" / "train" / "a")
    make_images(tmp_path / "data" / "train" / "b")
    cache = tmp_path / "cache"
    monkeypatch.setattr(shutil, "disk_usage", fake_disk_usage(1000))
    monkeypatch.setattr(cache_mod, "decode_image", lambda *a, **k: pytest.fail("decoded with no space to keep it"))
    with pytest.raises(CacheError) as e:
        build(paths, cache)
    msg = str(e.value)
    assert "\n" not in msg and str(cache) in msg and "needs 1.9 KiB, 1000 B free" in msg and "--cache-dir" in msg
    assert files(cache) == []
    # through the CLI: `vitlab train: error: <that line>`, exit 2
    args = ["train", "--data", str(tmp_path / "data"), "--val-split", "0.2", "--cache-dir", str(cache)]
    assert main([*args, "--epochs", "1", "--no-progress", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitlab train: error: ") and "not enough disk space" in err[0]
    assert files(cache) == []


def test_a_cache_folder_that_cannot_be_made_is_one_line_naming_the_way_out(tmp_path, monkeypatch, capsys):
    """A HOME that does not exist or cannot be written (a service account, a read-only image): before, ``vitlab train:
    error: [Errno 2] No such file or directory: '/nonexistent'``, naming neither the cache nor a way round it;
    ``fewshot`` had no ``--cache-dir`` to take one."""
    import vitlab

    make_images(tmp_path / "data" / "a")
    make_images(tmp_path / "data" / "b")
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("VITLAB_CACHE", str(blocker / "cache"))  # under a file: no user, root included, can make it
    args = ["--data", str(tmp_path / "data"), "--no-progress"]
    assert main(["train", *args, "--epochs", "1", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"vitlab train: error: {blocker / 'cache'}: cannot make the folder")
    assert "--cache-dir DIR or set $VITLAB_CACHE" in err[0]

    model = vitlab.VisionTransformer(
        img_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=2, class_names=["a", "b"]
    )
    vitlab.save(model, tmp_path / "m")
    few = ["fewshot", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "data"), "--shots", "1", "--no-probe"]
    assert main([*few, "--out", str(tmp_path / "f.json")]) == 2
    assert "cannot make the folder of the decode caches" in capsys.readouterr().err
    assert main([*few, "--out", str(tmp_path / "f.json"), "--cache-dir", str(tmp_path / "c")]) == 0
    assert files(tmp_path / "c")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_no_space_when_reserving_is_one_line_and_leaves_no_temp_file(tmp_path, monkeypatch, code):
    """``disk_usage`` can be wrong (quotas, other writers): the reservation is where ``ENOSPC`` shows,
    before anything is written through a memory map that the disk cannot back (SIGBUS)."""
    paths = make_images(tmp_path / "img")
    cache = tmp_path / "cache"

    def no_space(fd, offset, length):
        raise OSError(code, "No space left on device")

    monkeypatch.setattr(cache_mod.os, "posix_fallocate", no_space, raising=False)
    with pytest.raises(CacheError, match=r"not enough disk space .* needs 1\.9 KiB, .* free; .* --cache-dir") as e:
        build(paths, cache)
    assert "\n" not in str(e.value) and str(cache) in str(e.value)
    assert files(cache) == []


def test_an_unsupported_reservation_falls_back_to_writing(tmp_path, monkeypatch):
    paths = make_images(tmp_path / "img")

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(cache_mod.os, "posix_fallocate", unsupported, raising=False)
    assert build(paths, tmp_path / "cache").images.shape == (N, 8, 8, 3)


def test_the_build_never_writes_through_a_memory_map(tmp_path, monkeypatch):
    """Pages of a mapping written on a full disk kill the process with SIGBUS; ``write()`` returns ENOSPC."""
    real = np.memmap

    def read_only(*a, **k):
        assert k.get("mode", "r+") == "r", "the cache file was mapped for writing"
        return real(*a, **k)

    monkeypatch.setattr(cache_mod.np, "memmap", read_only)
    build(make_images(tmp_path / "img"), tmp_path / "cache")


@pytest.mark.parametrize("damage", ["truncated", "grown", "missing"])
def test_a_data_file_of_the_wrong_size_is_rebuilt_with_a_message(tmp_path, capsys, damage):
    paths = make_images(tmp_path / "img")
    cache = tmp_path / "cache"
    fresh = np.array(build(paths, cache).images)
    data_f = one_file(cache, ".u8")
    if damage == "missing":
        data_f.unlink()
    else:
        with open(data_f, "r+b") as f:
            f.truncate(data_f.stat().st_size + (-100 if damage == "truncated" else 100))
    again = build(paths, cache)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{data_f}: not a valid decode cache" in err and "decoding again" in err
    np.testing.assert_array_equal(again.images, fresh)
    assert build(paths, cache).images.shape == fresh.shape and capsys.readouterr().err == ""  # healed


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"{not json",
        b"\xff\xfe\x00garbage",
        b"[1, 2, 3]",
        b'{"version": 3}',
        "shape",
        "kept",
        "crc32",
        "version",
    ],
)
def test_garbage_metadata_is_rebuilt_with_a_message(tmp_path, capsys, garbage):
    import json

    paths = make_images(tmp_path / "img")
    cache = tmp_path / "cache"
    fresh = np.array(build(paths, cache).images)
    meta_f = one_file(cache, ".json")
    if isinstance(garbage, bytes):
        meta_f.write_bytes(garbage)
    else:  # valid JSON, one field wrong
        meta = json.loads(meta_f.read_text())
        meta[garbage] = {"shape": [N, 8, 8], "kept": list(range(N - 1)), "crc32": ["x"], "version": 2}[garbage]
        meta_f.write_text(json.dumps(meta))
    again = build(paths, cache)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{meta_f}: not a valid decode cache" in err
    np.testing.assert_array_equal(again.images, fresh)
    assert again.kept == list(range(N))


# 400: a chunk (3 images of 192 bytes) is read in 200-byte pieces; an image may take at most half the budget
@pytest.mark.parametrize("budget", [cache_mod.DEFAULT_BUFFER_BYTES, 400])
@pytest.mark.parametrize("where", [0, 5 * 8 * 8 * 3 + 17, N * 8 * 8 * 3 - 1])
def test_a_flipped_byte_is_detected_and_rebuilt(tmp_path, capsys, small_chunks, where, budget):
    paths = make_images(tmp_path / "img")
    cache = tmp_path / "cache"
    fresh = np.array(build(paths, cache, buffer_bytes=budget).images)
    assert build(paths, cache, buffer_bytes=budget).images.shape == fresh.shape and capsys.readouterr().err == ""
    data_f = one_file(cache, ".u8")
    with open(data_f, "r+b") as f:
        f.seek(where)
        b = f.read(1)[0]
        f.seek(where)
        f.write(bytes([b ^ 0x01]))
    again = build(paths, cache, buffer_bytes=budget)
    err = capsys.readouterr().err
    first = where // (8 * 8 * 3) // 3 * 3
    assert err.count("\n") == 1 and f"{data_f}: not a valid decode cache" in err
    assert f"images {first}-{min(first + 2, N - 1)} do not match their checksum" in err
    np.testing.assert_array_equal(again.images, fresh)  # the rebuilt data is a fresh decode, not the damaged file


def test_two_writers_of_one_cache_do_not_share_a_temp_file(tmp_path, monkeypatch):
    """Both writers are in the middle of decoding at the same time (a barrier): with one temp name
    per process, one would rename the other's file away and fail."""
    paths = make_images(tmp_path / "img")
    cache = tmp_path / "cache"
    real = cache_mod.decode_image
    barrier, lock, calls = threading.Barrier(2), threading.Lock(), [0]

    def decode(*a, **k):
        with lock:
            calls[0] += 1
            first = calls[0] <= 2  # each writer's first file (one decoding thread each)
        if first:
            barrier.wait(timeout=30)
        return real(*a, **k)

    monkeypatch.setattr(cache_mod, "decode_image", decode)
    results, errors = [], []

    def writer():
        try:
            results.append(np.array(build(paths, cache).images))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(results) == 2
    monkeypatch.setattr(cache_mod, "decode_image", real)
    shutil.rmtree(tmp_path / "fresh", ignore_errors=True)
    fresh = np.array(build(paths, tmp_path / "fresh").images)
    for r in [*results, np.array(build(paths, cache).images)]:
        np.testing.assert_array_equal(r, fresh)
    assert [f for f in files(cache) if ".tmp" in f] == []


def test_temp_files_of_dead_writers_are_removed(tmp_path):
    paths = make_images(tmp_path / "img")
    cache = tmp_path / "cache"
    build(paths, cache)
    stem = one_file(cache, ".u8").name[: -len(".u8")]
    for f in cache.iterdir():
        f.unlink()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (cache / f"{stem}.tmp{dead_pid}-0badc0de").write_bytes(b"half a cache")
    (cache / f"{stem}.tmp{dead_pid}-0badc0de.json").write_bytes(b"{")
    live = cache / f"{stem}.tmp1-12345678"  # pid 1 is alive: another writer's file is left alone
    live.write_bytes(b"being written")
    build(paths, cache)
    assert files(cache) == sorted([f"{stem}.u8", f"{stem}.json", live.name])


def test_a_cache_of_only_skipped_files_opens_again(tmp_path, capsys):
    """All files unreadable: a cache of zero images, which cannot be memory-mapped, is still a cache."""
    (tmp_path / "bad.png").write_bytes(b"not an image")
    first = build([str(tmp_path / "bad.png")], tmp_path / "cache", size=8)
    again = build([str(tmp_path / "bad.png")], tmp_path / "cache", size=8)
    assert first.images.shape == again.images.shape == (0, 8, 8, 3) and again.skipped == first.skipped
    assert capsys.readouterr().err == ""

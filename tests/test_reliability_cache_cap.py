"""Issue 56, "caches bounded": one size cap for the decode caches (a default, `vitlab cache limit` to change it, the
least recently used dropped first, never what vitlab did not write nor a cache another process reads), a larger
cached side serving a smaller one where their pixels are the same, and `inspect` decoding only the images it
shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitlab._units import format_size
from vitlab.cli import main
from vitlab.data.cache import limit as cl
from vitlab.data.cache.admin import list_caches
from vitlab.data.cache.store import decode_files


def images(root: Path, n: int = 6, size=(20, 16), seed: int = 0) -> list[str]:
    """``n`` distinct PNGs of ``size`` (width, height) in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        p = root / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    return paths


def build(paths, cache, name, **kw):
    """A cache of ``paths`` named ``name``, not held afterwards (no memory map of it lives on)."""
    dec = decode_files(paths, cache_dir=cache, name=name, progress=False, workers=1, **kw)
    return dec.path


def names(cache) -> set[str]:
    return {e.path.name.split("-")[0] for e in list_caches(cache)}


@pytest.fixture
def cap(tmp_path, monkeypatch):
    """A cap of three and a half caches of `images(...)` (through the variable, which wins over any setting)."""
    one = list_caches(build(images(tmp_path / "probe"), tmp_path / "probe-cache", "probe").parent)[0].bytes
    monkeypatch.setenv(cl.MAX_SIZE_ENV, str(int(3.5 * one)))
    monkeypatch.setattr(cl, "MIN_MAX_BYTES", 1)
    return one


def test_the_least_recently_used_cache_goes_first(tmp_path, cap, capsys):
    cache = tmp_path / "cache"
    a_files = images(tmp_path / "a", seed=1)
    a = build(a_files, cache, "a")
    build(images(tmp_path / "b", seed=2), cache, "b")
    build(images(tmp_path / "c", seed=3), cache, "c")
    os.utime(a, (1, 1))  # a is the oldest ...
    assert build(a_files, cache, "a") == a  # ... until it is used again: opening marks it
    assert a.stat().st_mtime > 1
    build(images(tmp_path / "d", seed=4), cache, "d")  # four do not fit: b, the least recently used, goes
    assert names(cache) == {"a", "c", "d"}
    err = capsys.readouterr().err
    assert "deleted 1 least recently used cache(s)" in err and "cap of" in err
    assert sum(e.bytes for e in list_caches(cache)) <= int(os.environ[cl.MAX_SIZE_ENV])


def test_eviction_never_deletes_what_vitlab_did_not_write(tmp_path, cap):
    cache = tmp_path / "cache"
    cache.mkdir()
    victim = tmp_path / "victim.u8"
    victim.write_bytes(b"precious")
    key = "0123456789abcdef0123"
    (cache / f"link-{key}.json").write_text(json.dumps({"key": key, "version": 6, "count": 1, "shape": [1, 1, 1, 3]}))
    (cache / f"link-{key}.u8").symlink_to(victim)  # a link is never taken for a cache
    (cache / f"user-{key}.json").write_text("not json")  # a pair with the right names but not vitlab's metadata
    (cache / f"user-{key}.u8").write_bytes(b"x" * 10_000)
    (cache / "notes.json").write_text("{}")  # anything else
    (cache / "hub").mkdir()
    for i in range(5):
        build(images(tmp_path / f"d{i}", seed=i), cache, f"d{i}")
    assert names(cache) == {"d2", "d3", "d4"}
    assert victim.read_bytes() == b"precious" and (cache / f"link-{key}.u8").is_symlink()
    assert (cache / f"user-{key}.u8").stat().st_size == 10_000 and (cache / "notes.json").is_file()
    assert (cache / "hub").is_dir()


READER = textwrap.dedent(
    """
    import sys
    from vitlab.data.cache.store import decode_files
    paths = sys.argv[2:]
    dec = decode_files(paths, cache_dir=sys.argv[1], name="held", progress=False, workers=1)
    print(dec.path, flush=True)
    sys.stdin.read()  # hold the memory map until the parent closes our stdin
    """
)


def test_a_cache_another_process_reads_is_never_evicted(tmp_path, cap):
    cache = tmp_path / "cache"
    held_paths = images(tmp_path / "held", seed=9)
    build(held_paths, cache, "held")
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(cache), *held_paths], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        held = Path(reader.stdout.readline().strip())  # the event: the reader has the cache open
        assert held.is_file() and cl.in_use(held)
        for i in range(5):  # held is the least recently used of all, and still kept
            build(images(tmp_path / f"d{i}", seed=i), cache, f"d{i}")
        assert "held" in names(cache)
    finally:
        reader.stdin.close()
        assert reader.wait(timeout=60) == 0
    assert not cl.in_use(held)  # the kernel released the lock with the reader
    build(images(tmp_path / "e", seed=20), cache, "e")
    assert "held" not in names(cache)


def test_cache_limit_sets_shows_and_validates_the_cap(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(cl.MAX_SIZE_ENV, raising=False)
    cache = tmp_path / "cache"
    assert cl.cache_limit(cache).max_bytes == cl.DEFAULT_MAX_BYTES == 20 << 30
    for i in range(3):
        build(images(tmp_path / f"d{i}", seed=i), cache, f"d{i}")
    assert main(["cache", "limit", "--cache-dir", str(cache)]) == 0
    assert "cap 20.0 GiB (the default" in capsys.readouterr().out
    assert main(["cache", "limit", "2M", "--cache-dir", str(cache)]) == 0
    assert json.loads((cache / cl.SETTINGS_NAME).read_text()) == {"max_size": 2 << 20}
    assert "cap 2.0 MiB" in capsys.readouterr().out and cl.cache_limit(cache).max_bytes == 2 << 20
    monkeypatch.setattr(cl, "MIN_MAX_BYTES", 1)
    one = max(e.bytes for e in list_caches(cache))
    assert main(["cache", "limit", str(one + one // 2), "--cache-dir", str(cache)]) == 0  # a lower cap applies now
    assert names(cache) == {"d2"} and "deleted 2 least recently used" in capsys.readouterr().err
    assert main(["cache", "ls", "--cache-dir", str(cache)]) == 0
    assert f"cap {format_size(one + one // 2)} ({cache / cl.SETTINGS_NAME})" in capsys.readouterr().out
    assert main(["cache", "limit", "none", "--cache-dir", str(cache)]) == 0
    assert cl.cache_limit(cache).max_bytes is None
    assert main(["cache", "limit", "default", "--cache-dir", str(cache)]) == 0
    assert not (cache / cl.SETTINGS_NAME).exists()
    monkeypatch.setenv(cl.MAX_SIZE_ENV, "1G")  # the variable wins
    assert cl.cache_limit(cache).max_bytes == 1 << 30
    assert main(["cache", "limit", "5G", "--cache-dir", str(cache)]) == 0
    assert f"${cl.MAX_SIZE_ENV} is set" in capsys.readouterr().err and cl.cache_limit(cache).max_bytes == 1 << 30
    monkeypatch.setattr(cl, "MIN_MAX_BYTES", 1 << 20)
    for bad in (["limit", "lots"], ["limit", "1K"], ["ls", "5G"], ["limit", "--older-than", "1d"]):
        assert main(["cache", *bad, "--cache-dir", str(cache)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("vitlab cache: error:"), err


@pytest.mark.parametrize(
    "content",
    ["link", "huge", "garbage", '{"max_size": "lots"}', '{"max_size": -1}', '{"max_size": 5, "x": 1}', "folder"],
)
def test_a_bad_settings_file_is_one_warning_and_the_default(tmp_path, monkeypatch, content):
    monkeypatch.delenv(cl.MAX_SIZE_ENV, raising=False)
    cache = tmp_path / "cache"
    cache.mkdir()
    settings = cache / cl.SETTINGS_NAME
    victim = tmp_path / "victim"
    victim.write_text('{"max_size": 2048}')
    if content == "link":
        settings.symlink_to(victim)
    elif content == "huge":
        settings.write_text('{"max_size": 2097152}' + " " * (cl.SETTINGS_MAX_BYTES + 1))
    elif content == "folder":
        settings.mkdir()
    else:
        settings.write_text(content)
    limit = cl.cache_limit(cache)
    assert limit.max_bytes == cl.DEFAULT_MAX_BYTES and limit.warning and str(settings) in limit.warning
    if content != "folder":  # setting the cap replaces the file (a link too), never writes through it
        cl.set_cache_limit(cache, "3G")
        assert not settings.is_symlink() and cl.cache_limit(cache).max_bytes == 3 << 30
    assert victim.read_text() == '{"max_size": 2048}'


def test_a_larger_cached_side_serves_a_smaller_one_with_the_same_pixels(tmp_path):
    """Images no larger than either side are stored as they are at both: one cache serves both, and its pixels are
    those of a fresh decode at the smaller side (byte for byte). Two layouts of the same native images share it."""
    paths = images(tmp_path / "small", size=(20, 16))
    cache = tmp_path / "cache"
    big = decode_files(paths, cache_dir=cache, name="s", progress=False, keep_aspect=True, max_side=64)
    small = decode_files(paths, cache_dir=cache, name="s", progress=False, keep_aspect=True, max_side=24)
    squares = decode_files(paths, cache_dir=cache, name="s", progress=False, fallback_size=24, max_side=24)
    assert small.path == big.path == squares.path and len(list_caches(cache)) == 1
    fresh = decode_files(paths, cache_dir=tmp_path / "fresh", name="s", progress=False, keep_aspect=True, max_side=24)
    assert np.array_equal(np.asarray(small.images), np.asarray(fresh.images))


def test_a_smaller_side_of_shrunk_photos_is_decoded_again_as_a_fresh_decode(tmp_path):
    """Photos shrunk at both sides: the smaller side is decoded from the files, not resized from the larger copy
    (PIL's bicubic resize is not composable, so that copy resized would differ from what every other path decodes),
    and its pixels equal a fresh decode; the cap, not sharing, bounds what the two take."""
    paths = images(tmp_path / "photos", size=(120, 90))
    cache = tmp_path / "cache"
    big = decode_files(paths, cache_dir=cache, name="p", progress=False, keep_aspect=True, max_side=60)
    small = decode_files(paths, cache_dir=cache, name="p", progress=False, keep_aspect=True, max_side=30)
    assert small.path != big.path
    fresh = decode_files(paths, cache_dir=tmp_path / "fresh", name="p", progress=False, keep_aspect=True, max_side=30)
    assert np.array_equal(np.asarray(small.images), np.asarray(fresh.images))
    resized = np.stack(
        [np.asarray(Image.fromarray(np.asarray(im)).resize((40, 30), Image.Resampling.BICUBIC)) for im in big.images]
    )
    assert not np.array_equal(resized, np.asarray(small.images))  # why the larger copy does not serve


@pytest.mark.slow
def test_inspect_decodes_only_the_images_it_shows(tmp_path, capsys, monkeypatch):
    """The issue's case: `vitlab inspect` of a 64-px run decoded the whole training split again at 240 px (12 s,
    605 MiB) to show a few validation images. It decodes the images it shows, and writes no decode cache."""
    import torch

    import vitlab
    from vitlab.data.images import decode

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "photos"
    for split, n in (("train", 20), ("val", 5)):
        for c in ("a", "b"):
            images(data / split / c, n=n, size=(48, 40), seed=hash((split, c)) % 1000)
    torch.manual_seed(0)
    model = vitlab.VisionTransformer(
        img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, mlp_dim=16, num_classes=2, class_names=["a", "b"]
    )
    vitlab.save(model, tmp_path / "run" / "model", extra={"data": str(data)})
    calls = []
    real = decode.decode_image
    monkeypatch.setattr(decode, "decode_image", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    out = tmp_path / "insp"
    args = ["inspect", "--model", str(tmp_path / "run"), "--num-images", "3", "--show", "2", "--out", str(out)]
    assert main(args) == 0
    assert (out / "report.html").is_file() and list_caches(tmp_path / "cache") == []
    assert len(calls) == 3 and all("/val/" in str(p) for p in calls)
    assert "the val split of the data the model was trained on" in capsys.readouterr().out

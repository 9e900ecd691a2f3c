"""Tar shards, manifests, ``vitlab data pack`` and the saved data location, as someone else's files would meet them.

Nothing read from ``last.pt`` or a manifest reaches a shell; shards listed twice, lying manifests, oversized
members and patterns, damaged tars are one line each; ``data pack`` checks what it packs, never follows a link out
of the source, streams its files, and leaves nothing behind on a full disk.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import shutil
import tarfile
import time
import tracemalloc

import numpy as np
import pytest
import torch
from PIL import Image

from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.data.shards import write as shards_mod
from vitlab.data.shards.manifest import MANIFEST, PackError, read_manifest
from vitlab.data.shards.names import count_names
from vitlab.data.shards.source import iter_samples, open_shard, open_source
from vitlab.data.shards.stream import ShardStream
from vitlab.data.shards.write import pack_folder, read_shard
from vitlab.errors import DataError
from vitlab.train.conf.resume import resumed_config
from vitlab.train.conf.train_config import TrainConfig
from vitlab.train.persist.state import load_state

ARGS = ["--epochs", "1", "--batch-size", "8", "--patch-size", "4", "--dim", "8", "--depth", "1", "--heads", "2"]
ARGS += ["--img-size", "8", "--shuffle-buffer", "10", "--workers", "0", "--no-progress"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """24 train samples in 6 shards of 4, and 6 test samples."""
    root = tmp_path_factory.mktemp("shards")
    folder = tiny_folder(root / "rgb", per_class=8, test_per_class=2)
    one = (folder / "train" / "class0" / "00.png").stat().st_size
    pack_folder(folder, root / "packed", shard_bytes=4 * one, progress=False)
    return root / "packed"


def one_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vitlab "), err
    for w in words:
        assert w in err, (w, err)
    return err


def copy(packed, tmp_path):
    return shutil.copytree(packed, tmp_path / "copy")


def pattern(folder, split="train") -> str:
    n = len(read_manifest(folder)["splits"][split]["shards"])
    return f"{folder}/{split}-{{000000..{n - 1:06d}}}.tar"


def read_all(shards) -> int:
    return sum(1 for _ in ShardStream(shards=shards, transform=lambda b: torch.zeros(1), out_shape=(1,), num_classes=3))


# 1. No shell, ever, from a file


@pytest.mark.slow
def test_a_pipe_in_last_pt_never_runs(packed, tmp_path, capsys):
    """``--resume`` takes ``--data`` from ``last.pt`` (a weights_only dict, no pickle needed): a ``pipe:`` value there
    is refused, with or without ``--allow-pipe``, unless the same command is typed again with the flag."""
    run, target = tmp_path / "run", tmp_path / "pwned"
    assert main(["train", "--data", str(packed), "--out", str(run), "--stop-after", "1", *ARGS]) == 0
    state = load_state(run / "last.pt")
    cfg = json.loads(state["config"])
    evil = f"pipe:touch {target}; cat {pattern(packed)}"
    cfg.update(data=evil, allow_pipe=True)  # a saved "trust" is not trust either
    state["config"] = json.dumps(cfg)
    torch.save(state, run / "last.pt")
    capsys.readouterr()
    for extra in ([], ["--allow-pipe"], ["--allow-pipe", "--data", evil.replace("touch", "TOUCH")]):
        assert main(["train", "--out", str(run), "--resume", "--no-progress", *extra]) == 2, extra
        one_line(capsys, "pipe:", "--allow-pipe")
        assert not target.exists(), extra


def test_allow_pipe_is_never_taken_from_the_saved_run():
    saved = TrainConfig(data="pipe:cat a.tar", allow_pipe=True)
    state = {"config": json.dumps(saved.to_dict())}
    for flags, given in (
        (None, TrainConfig(data="digits", allow_pipe=True)),  # a library call cannot say what was typed
        (set(), TrainConfig()),
        ({"--allow-pipe"}, TrainConfig(allow_pipe=True)),  # the flag without the command
        ({"--data"}, TrainConfig(data="pipe:cat a.tar")),  # the command without the flag
        ({"--data", "--allow-pipe"}, TrainConfig(data="pipe:CAT a.tar", allow_pipe=True)),  # another command
    ):
        assert resumed_config(state, given, flags=flags).allow_pipe is False, flags
    typed = TrainConfig(data=" pipe:cat a.tar", allow_pipe=True)
    assert resumed_config(state, typed, flags={"--data", "--allow-pipe"}).allow_pipe is True


def test_pipes_and_unknown_schemes_anywhere_in_a_data_value_are_refused(packed, tmp_path):
    target = tmp_path / "pwned"
    first = f"{packed}/train-000000.tar"
    for spec in (
        f"{first}::pipe:touch {target}",  # not only the first name
        f"{{{first},pipe:touch {target}}}",  # made by braces
        f"PIPE:touch {target}",  # schemes are case-blind
    ):
        with pytest.raises(DataError, match="--allow-pipe") as e:
            open_source(spec)
        assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="not a scheme vitlab reads"):
        open_source("ftp://host/train-{0..3}.tar")
    assert not target.exists()


@pytest.mark.slow
def test_eval_reads_a_pipe_only_with_allow_pipe(packed, tmp_path, capsys):
    run, target = tmp_path / "run", tmp_path / "ran"
    assert main(["train", "--data", str(packed), "--out", str(run), *ARGS]) == 0
    piped = f"pipe:touch {target}; cat {pattern(packed, 'test')}"
    capsys.readouterr()
    argv = ["eval", "--model", str(run / "model"), "--data", piped, "--output", str(tmp_path / "e.json")]
    assert main(argv) == 2
    one_line(capsys, "--allow-pipe")
    assert not target.exists()
    assert main([*argv, "--allow-pipe"]) == 0  # typed with the flag: the user's own command runs
    assert target.exists() and json.loads((tmp_path / "e.json").read_text())["count"] == 6


@pytest.mark.parametrize("name", ["pipe:touch {target}", "../../etc/x.tar", "/etc/x.tar", "https://host/x.tar"])
def test_a_manifest_naming_anything_but_a_file_in_its_folder_is_refused(packed, tmp_path, capsys, name):
    target = tmp_path / "pwned"
    folder = copy(packed, tmp_path)
    m = json.loads((folder / MANIFEST).read_text())
    m["splits"]["train"]["shards"][1]["name"] = name.format(target=target)
    (folder / MANIFEST).write_text(json.dumps(m))
    for spec in (str(folder), pattern(packed).replace(str(packed), str(folder))):
        with pytest.raises(PackError, match=r"splits\.train\.shards\[1\]\.name: expected a plain file name"):
            open_source(spec)
    assert main(["train", "--data", str(folder), "--out", str(tmp_path / "run"), *ARGS]) == 2
    one_line(capsys, "plain file name")
    assert not target.exists()


# 2. Duplicate shards


def test_a_shard_listed_twice_is_refused(packed, monkeypatch):
    monkeypatch.chdir(packed.parent)
    for spec in (
        "packed/train-{000000..000002}.tar::packed/train-000001.tar",  # a pattern overlapping a :: list
        "packed/train-000000.tar::./packed/train-000000.tar",  # two spellings of one file
        "packed/train-{000000,000001,000000}.tar",
    ):
        with pytest.raises(DataError, match="is listed twice.*; list each shard once"):
            open_source(spec, val_split=0.5)
    assert len(open_source("packed/train-{000000..000003}.tar", val_split=0.5).train) == 8


# 3. Strict manifests


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda m: m.update(classes="class0,class1"), "classes: expected a list"),
        (lambda m: m["classes"].__setitem__(1, 7), r"classes\[1\]: expected a class name"),
        (lambda m: m["splits"]["train"]["shards"][0].update(samples=2.5), r"shards\[0\]\.samples: expected a whole"),
        (lambda m: m["splits"]["train"]["shards"][0].update(samples=-4), r"shards\[0\]\.samples: expected a whole"),
        (lambda m: m["splits"]["train"]["shards"][0].update(samples=True), r"shards\[0\]\.samples: expected a whole"),
        (lambda m: m["splits"]["train"]["shards"][0].update(samples="4"), r"shards\[0\]\.samples: expected a whole"),
        (lambda m: m["splits"]["train"].update(samples=25), r"splits\.train\.samples: 25, but its shards add up to 24"),
        (lambda m: m["splits"].update(extra=m["splits"]["test"]), r"splits\.extra: not a split vitlab reads"),
        (lambda m: m["splits"]["train"]["shards"][0].update(sha256=None), r"shards\[0\]\.sha256: expected 64"),
        (lambda m: m["splits"]["test"]["shards"].append(m["splits"]["train"]["shards"][0]), "is listed twice"),
        (lambda m: m["splits"]["train"]["shards"][0].update(class_counts=[1, 1]), r"class_counts: expected 3"),
    ],
)
def test_a_manifest_with_a_wrong_field_is_one_line_naming_it(packed, tmp_path, edit, field):
    folder = copy(packed, tmp_path)
    m = json.loads((folder / MANIFEST).read_text())
    edit(m)
    (folder / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(PackError, match=field) as e:
        open_source(str(folder))
    assert "\n" not in str(e.value) and str(folder / MANIFEST) in str(e.value)


def test_a_deep_or_huge_manifest_is_refused_before_it_is_parsed(packed, tmp_path, capsys):
    folder = copy(packed, tmp_path)
    (folder / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(PackError, match="nested too deeply"):
        read_manifest(folder)
    with open(folder / MANIFEST, "wb") as f:
        f.truncate(17 << 20)  # sparse: nothing to read if it is refused by its size
    with pytest.raises(PackError, match="larger than the 16 MiB"):
        read_manifest(folder)
    assert main(["train", "--data", str(folder), "--out", str(tmp_path / "run"), *ARGS]) == 2
    one_line(capsys, "16 MiB")


@pytest.mark.parametrize("lie", [-1, +1])
def test_a_manifest_that_miscounts_a_shard_is_caught_at_its_end(packed, tmp_path, lie):
    """Under-counted (the shard's last sample would never be read) or over-counted: an error naming the shard."""
    folder = copy(packed, tmp_path)
    m = json.loads((folder / MANIFEST).read_text())
    sh = m["splits"]["train"]["shards"][2]
    sh["samples"] += lie
    del sh["class_counts"]
    m["splits"]["train"]["samples"] += lie
    (folder / MANIFEST).write_text(json.dumps(m))
    shards = open_source(str(folder)).train
    want = "holds more than the 3 samples" if lie < 0 else "holds 4 samples, not the 5"
    with pytest.raises(DataError, match=want) as e:
        read_all(shards)
    assert sh["name"] in str(e.value)


def test_a_huge_class_index_never_builds_a_billion_names(packed, tmp_path):
    tar_path = tmp_path / "x-0.tar"
    shutil.copy(packed / "train-000000.tar", tar_path)
    with tarfile.open(tar_path, "a") as tar:
        for name, data in (("zz.png", (packed.parent / "rgb/train/class0/00.png").read_bytes()), ("zz.cls", b"1e9")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    start = time.monotonic()
    with pytest.raises(DataError, match="not a class index"):
        open_source(str(tar_path))
    with tarfile.open(tar_path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar]
    with tarfile.open(tar_path, "w") as tar:
        for m, data in members:
            data = b"1000000000" if m.name == "zz.cls" else data
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))
    with pytest.raises(DataError, match=r"zz: the \.cls member is not a class index from 0 to 999,999") as e:
        open_source(str(tar_path))
    assert "\n" not in str(e.value) and time.monotonic() - start < 30


# 4. Bounded reads and damaged tars


def test_a_huge_member_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.tar"
    info = tarfile.TarInfo("k.png")
    info.size = 3 << 30  # the header says 3 GiB; the data is not there (reading it whole would try)
    path.write_bytes(info.tobuf(format=tarfile.USTAR_FORMAT))
    with open_shard(str(path)) as tar, pytest.raises(DataError, match=r"k\.png is 3,221,225,472 bytes, over the"):
        list(iter_samples(tar, lambda i: True, where=str(path)))


def test_a_brace_pattern_is_counted_before_it_is_expanded():
    import braceexpand

    for p in ("a{1..3}b{x,y{0..2},z}c", "{07..10}", "{a..g..2}{4..1}", "x{1,2}{,.bak}", r"{1\{2,3}", "{Z..a}", "{}"):
        assert count_names(p) == len(list(braceexpand.braceexpand(p))), p
    start = time.monotonic()
    for p in ("s/train-{000000..099999999}.tar", "{0..999}{0..999}{0..9}", "{0..9}" * 40, "x{" * 100_000):
        with pytest.raises(DataError) as e:
            open_source(p)
        assert "\n" not in str(e.value) and ("more than 1,000,000" in str(e.value) or "nested" in str(e.value))
    assert time.monotonic() - start < 30


def _damage(path, how):
    raw = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "gzip":
        path.write_bytes(gzip.compress(raw))
    elif how == "html":
        path.write_bytes(b"<html><body>404 Not Found</body></html>\n" * 20)
    elif how == "truncated":
        path.write_bytes(raw[:700])


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("empty", "an empty file"),
        ("gzip", "gzip-compressed"),
        ("html", "not a tar file"),
        ("truncated", "truncated or damaged tar"),
    ],
)
def test_a_damaged_shard_is_one_line_naming_it(packed, tmp_path, capsys, how, why):
    folder = tmp_path / "bare"
    folder.mkdir()
    for i in range(4):
        shutil.copy(packed / f"train-{i:06d}.tar", folder / f"s-{i}.tar")
    _damage(folder / "s-1.tar", how)
    spec = f"{folder}/s-{{0..3}}.tar"
    assert main(["train", "--data", spec, "--out", str(tmp_path / "run"), "--val-split", "0.25", *ARGS]) == 2
    one_line(capsys, "s-1.tar", why)


def test_a_shard_truncated_after_it_was_counted_is_one_line_mid_read(packed, tmp_path):
    folder = copy(packed, tmp_path)
    (folder / MANIFEST).unlink()
    src = open_source(pattern(packed).replace(str(packed), str(folder)), val_split=0.2)
    victim = src.train.shards[1].url
    with open(victim, "r+b") as f:
        f.truncate(700)  # cut inside the first image
    with pytest.raises(DataError, match="truncated or damaged tar") as e:
        read_all(src.train)
    assert victim in str(e.value) and "\n" not in str(e.value)


# 5. vitlab data pack


def _png(path, seed=0, side=8) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)
    return path.read_bytes()


def _shard_bytes(out) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(out.glob("*.tar")))


def test_pack_leaves_out_what_cannot_be_decoded_and_names_it(tmp_path, capsys):
    src = tiny_folder(tmp_path / "src", per_class=3, test_per_class=1)
    (src / "train/class0/empty.png").write_bytes(b"")
    (src / "train/class1/page.jpg").write_bytes(b"<!DOCTYPE html><html>Sign in to continue</html>")
    (src / "train/class2/cut.png").write_bytes((src / "train/class2/00.png").read_bytes()[:60])
    out = tmp_path / "out"
    assert main(["data", "pack", str(src), str(out), "--no-progress"]) == 0
    assert "left out 3 file(s)" in capsys.readouterr().out
    bad = dict(line.split("\t") for line in (out / "bad_files.txt").read_text().splitlines())
    names = ("train/class0/empty.png", "train/class1/page.jpg", "train/class2/cut.png")
    assert set(bad) == {str(src / f) for f in names}
    for odd in (b"two\nlines.png", b"latin1-\xe9.png"):  # a name listed on one line, whatever bytes it holds
        with open(os.fsencode(src / "train/class0") + b"/" + odd, "wb"):
            pass
    pack_folder(src, tmp_path / "odd", progress=False)
    rows = (tmp_path / "odd" / "bad_files.txt").read_text().splitlines()
    assert len(rows) == 5 and any("two\\nlines.png" in r for r in rows) and any("latin1-\\xe9" in r for r in rows)
    for odd in (b"two\nlines.png", b"latin1-\xe9.png"):
        os.unlink(os.fsencode(src / "train/class0") + b"/" + odd)
    assert "empty file" in bad[str(src / "train/class0/empty.png")]
    assert "UnidentifiedImageError" in bad[str(src / "train/class1/page.jpg")]
    m = read_manifest(out, verify=True)
    assert m["splits"]["train"]["samples"] == 9 and m["skipped"] == 3
    keys = [k for sh in m["splits"]["train"]["shards"] for k, _, _ in read_shard(out / sh["name"])]
    assert all(k.startswith("train/class") and ".png/train" in k for k in keys)  # each key names its source file

    strict = tmp_path / "strict"
    assert main(["data", "pack", str(src), str(strict), "--strict-data", "--no-progress"]) == 2
    one_line(capsys, "cannot be packed", "--strict-data")
    assert not strict.exists()  # nothing left behind


def test_pack_never_follows_a_link_out_of_the_source(tmp_path):
    src = tiny_folder(tmp_path / "src", per_class=2, test_per_class=1)
    secret = _png(tmp_path / "secret.png", seed=7, side=12)  # a valid image: only the link rule keeps it out
    (src / "train/class0/leak.png").symlink_to(tmp_path / "secret.png")
    (src / "train/class1/inside.png").symlink_to(src / "test/class1/00.png")  # inside the source: fine
    out = tmp_path / "out"
    pack_folder(src, out, progress=False)
    assert secret not in _shard_bytes(out)
    assert "outside the folder being packed" in (out / "bad_files.txt").read_text()


def test_pack_streams_each_file_and_hashes_the_shard_as_it_writes(tmp_path):
    src = tmp_path / "src" / "c0"
    src.mkdir(parents=True)
    (tmp_path / "src" / "c1").mkdir()
    size = len(_png(src / "big.png", side=1000))  # noise: ~3 MB that does not compress
    _png(tmp_path / "src" / "c1" / "small.png")
    tracemalloc.start()
    m = pack_folder(tmp_path / "src", tmp_path / "out", progress=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 0.6 * size, (peak, size)  # neither the file nor the finished shard was held whole
    read_manifest(tmp_path / "out", verify=True)
    assert m["splits"]["train"]["samples"] == 2


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_pack_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys, code):
    src = tiny_folder(tmp_path / "src", per_class=4, test_per_class=1)
    one = (src / "train/class0/00.png").stat().st_size
    real, calls = shards_mod._write_all, []

    def no_space(fd, data):
        calls.append(len(data))
        if len(calls) > 2:  # two shards written, then the disk is full
            raise OSError(code, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(shards_mod, "_write_all", no_space)
    out = tmp_path / "out"
    assert main(["data", "pack", str(src), str(out), "--shard-size", str(3 * one), "--no-progress"]) == 2
    one_line(capsys, str(out), "cannot write the shards", "nothing was kept")
    assert not out.exists()
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    calls.clear()
    assert main(["data", "pack", str(src), str(keep), "--shard-size", str(3 * one), "--no-progress"]) == 2
    assert [p.name for p in keep.iterdir()] == ["notes.txt"]  # no temp file, no shard, the user's file kept


def test_pack_onto_existing_output_is_refused_unless_overwrite(tmp_path, capsys):
    src = tiny_folder(tmp_path / "src", per_class=2, test_per_class=1)
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    for extra in ([], ["--overwrite"]):
        assert main(["data", "pack", str(src), str(a_file), "--no-progress", *extra]) == 2
        one_line(capsys, "not a folder")
    assert a_file.read_text() == "mine"
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(src / "train/class0/00.png", out / "train-000007.tar")  # somebody's .tar, no manifest
    (out / "notes.txt").write_text("mine")
    assert main(["data", "pack", str(src), str(out), "--no-progress"]) == 2
    one_line(capsys, "already holds packed shards", "--overwrite")
    one = (src / "train/class0/00.png").stat().st_size
    assert main(["data", "pack", str(src), str(out), "--no-progress", "--overwrite", "--shard-size", str(one)]) == 0
    assert len(read_manifest(out)["splits"]["train"]["shards"]) == 6
    assert main(["data", "pack", str(src), str(out), "--no-progress"]) == 2  # now a manifest: refused again
    capsys.readouterr()
    assert main(["data", "pack", str(src), str(out), "--no-progress", "--overwrite"]) == 0  # into one shard
    assert "7 shard(s) of the previous pack are no longer listed and were left in place" in capsys.readouterr().out
    assert (out / "notes.txt").read_text() == "mine" and (out / "train-000007.tar").exists()  # never ours
    assert (out / "train-000005.tar").exists()  # ours, but not deleted either
    assert len(read_manifest(out, verify=True)["splits"]["train"]["shards"]) == 1
    inside = src / "train" / "packed"
    assert main(["data", "pack", str(src), str(inside), "--no-progress"]) == 2
    one_line(capsys, "inside the folder being packed")
    assert not inside.exists()

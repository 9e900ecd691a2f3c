"""``vitlab data pack``: an ImageFolder as WebDataset-style tar shards, read back through the manifest."""

from __future__ import annotations

import tarfile

import pytest

from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.data.shards.write import PackError, read_manifest, read_shard


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("src") / "rgb", per_class=5, test_per_class=2)


def test_pack_writes_shards_and_a_manifest_that_reads_back(folder, tmp_path, capsys):
    out = tmp_path / "shards"
    one = (folder / "train" / "class0" / "00.png").stat().st_size
    assert main(["data", "pack", str(folder), str(out), "--shard-size", str(4 * one), "--no-progress"]) == 0
    assert "train: 15 samples" in capsys.readouterr().out
    m = read_manifest(out, verify=True)
    assert m["classes"] == ["class0", "class1", "class2"]
    assert set(m["splits"]) == {"train", "test"}
    train = m["splits"]["train"]
    assert train["samples"] == 15 and len(train["shards"]) > 1  # the size limit split them
    assert [sh["name"] for sh in train["shards"]][:2] == ["train-000000.tar", "train-000001.tar"]
    assert [sum(c) for c in zip(*(sh["class_counts"] for sh in train["shards"]), strict=True)] == [5, 5, 5]

    # every source file, byte for byte, with its label, exactly once; in a shuffled order
    want = {p.read_bytes(): int(p.parent.name[-1]) for p in (folder / "train").rglob("*.png")}
    got, keys = {}, []
    for sh in train["shards"]:
        assert sh["samples"] == sum(1 for _ in read_shard(out / sh["name"]))
        for key, data, label in read_shard(out / sh["name"]):
            got[data] = label
            keys.append(key)
    assert got == want and len(keys) == 15 == len(set(keys))
    with tarfile.open(out / train["shards"][0]["name"]) as tar:  # the WebDataset layout: <key>.png + <key>.cls
        names = tar.getnames()
    assert names[0].endswith(".png") and names[1] == names[0].rsplit(".", 1)[0] + ".cls"


def test_manifest_catches_damage_and_pack_refuses_to_overwrite(folder, tmp_path, capsys):
    out = tmp_path / "shards"
    assert main(["data", "pack", str(folder), str(out), "--no-progress"]) == 0
    m = read_manifest(out)
    assert len(m["splits"]["train"]["shards"]) == 1  # 1GB default: one shard
    shard = out / m["splits"]["train"]["shards"][0]["name"]
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF
    shard.write_bytes(bytes(data))
    read_manifest(out)  # same size: only the checksum notices
    with pytest.raises(PackError, match="SHA-256"):
        read_manifest(out, verify=True)
    capsys.readouterr()
    assert main(["data", "pack", str(folder), str(out)]) == 2  # a second pack into the same folder
    assert main(["data", "pack", str(tmp_path / "nope"), str(tmp_path / "o2")]) == 2
    assert main(["data", "pack", str(folder), str(tmp_path / "o3"), "--shard-size", "big"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("vitlab data: error:") for e in err)


def test_pack_prints_the_manifest_path_once_joined_and_counts_in_agreement(folder, tmp_path, capsys):
    """Issue 36: `--out shards/` printed `shards//manifest.json`; one shard printed `1 shard(s)`."""
    out = f"{tmp_path / 'shards'}/"
    assert main(["data", "pack", str(folder), out, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"manifest: {tmp_path / 'shards' / 'manifest.json'};" in printed and "//" not in printed
    assert "test: 6 samples in 1 shard," in printed and "3 classes;" in printed


def test_pack_takes_its_folder_as_out_like_every_command(folder, tmp_path, capsys):
    """`vitlab data pack DIR --out OUT`, as `--out` is spelt in every other command (it was refused as unrecognised);
    OUT and a different --out are refused, and check, which writes no folder, refuses --out."""
    out = tmp_path / "shards"
    assert main(["data", "pack", str(folder), "--out", str(out), "--no-progress"]) == 0
    assert read_manifest(out)["splits"]["train"]["samples"] > 0
    capsys.readouterr()
    assert main(["data", "pack", str(folder), str(tmp_path / "a"), "--out", str(tmp_path / "b")]) == 2
    assert main(["data", "check", str(folder), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "differ; give one" in err[0] and "--out is an option of vitlab data pack" in err[1]
    assert not any((tmp_path / n).exists() for n in "abc")


def test_a_command_that_reads_folders_names_shards_it_is_given(folder, tmp_path, capsys):
    """`vitlab fewshot --data shards/` said "no class folders (expected shards/<class>/<image files>)"."""
    out = tmp_path / "shards"
    assert main(["data", "pack", str(folder), str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["fewshot", "--model", "vit_ti16", "--img-size", "16", "--data", str(out), "--no-probe"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tar shards, which this command does not read; give the image folder" in err[0], err

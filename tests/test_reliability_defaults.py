"""Issue 56, "defaults that follow the model" and "nothing silently wrong", and issue 57's one model rule in the
library: a model argument means one model in every command, in distillation's teacher and in ``--init``
(``vitlab.resolve_model``), and ``--model runs/X`` is the run's ``model/`` even with an export written beside it;
``eval``, ``fewshot`` and ``plan`` take a run folder and default to its own data; a plain class folder is evaluated
whole, and says so; an output folder is never read as data; names from files reach the terminal escaped; a model
with NaN weights is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import main

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--patch-size", "4"]


def tiny_model(classes=("a", "b", "c"), *, seed: int = 0) -> vitlab.VisionTransformer:
    torch.manual_seed(seed)
    m = vitlab.VisionTransformer(
        img_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_dim=16, num_classes=len(classes),
        class_names=list(classes),
    )  # fmt: skip
    torch.nn.init.normal_(m.head.weight, std=1.0)  # a head that tells the classes apart (they start at zero)
    return m


def run_folder(root: Path, model: vitlab.VisionTransformer, **extra) -> Path:
    """A run folder as `vitlab train --out` leaves it: the model in ``model/`` (recording ``extra``, e.g. its data)."""
    vitlab.save(model, root / "model", extra=extra, overwrite=True)
    return root


def plain_folder(root: Path, classes=("a", "b", "c"), n: int = 10) -> Path:
    """``root/<class>/NN.png``, no ``train/`` or ``val/``: ``n`` 8x8 images a class."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(n):
            arr = rng.integers(0, 80, (8, 8, 3)).astype(np.uint8)
            arr[..., c % 3] += 150
            Image.fromarray(arr).save(root / name / f"{i:02d}.png")
    return root


def one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"vitlab {command}: error: "), err
    return err[0]


# --- one model rule, in the library -----------------------------------------------------------------------------


def test_resolve_model_is_the_librarys_one_rule(tmp_path):
    run = run_folder(tmp_path / "run", tiny_model())
    got = vitlab.resolve_model(run)
    want = vitlab.load(run / "model")
    assert all(torch.equal(a, b) for a, b in zip(got.state_dict().values(), want.state_dict().values(), strict=True))
    assert vitlab.resolve_model("vit_ti16", img_size=32).config.img_size == (32, 32)  # an architecture: random
    with pytest.raises(vitlab.ConfigError) as e:  # where a trained model is needed, the same refusal for every option
        vitlab.resolve_model("vit_ti16", trained=True, option="--teacher")
    assert str(e.value).startswith("--teacher vit_ti16: a registered name is an untrained architecture")
    with pytest.raises(vitlab.UnknownModelError, match="did you mean vit_ti16"):
        vitlab.resolve_model("vit_tiny16")


def test_a_file_beside_the_model_names_its_folder(tmp_path):
    """`--model runs/X/model/config.json` (or the run's config.yaml) was read as a pickle: "not a PyTorch checkpoint
    (pickle data that torch's safe loader cannot read)". A text file names the folder to give instead."""
    run = run_folder(tmp_path / "run", tiny_model())
    (run / "config.yaml").write_text("data: digits\n")
    for given, folder in ((run / "model" / "config.json", run / "model"), (run / "config.yaml", run)):
        with pytest.raises(vitlab.CheckpointError) as e:
            vitlab.resolve_model(given)
        assert (
            str(e.value)
            == f"{given}: a {given.suffix} file beside the model, not its weights; give the folder: {folder}"
        )
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(vitlab.CheckpointError, match=r"notes.txt: a .txt file, not a checkpoint \(weights: "):
        vitlab.resolve_model(tmp_path / "notes.txt")


def export_into(run: Path, capsys) -> None:
    """``vitlab export`` of the run's model written into the run folder itself (config.json + model.safetensors)."""
    args = ["export", "--model", str(run / "model"), "--out", str(run), "--format", "torch", "--no-timing"]
    assert main(args) == 0
    assert json.loads((run / "config.json").read_text())["format"] == "vitlab-export"
    capsys.readouterr()


def test_an_export_written_into_a_run_folder_does_not_take_over_model_runs_x(tmp_path, capsys):
    """The issue's case: after the run resumed to epoch 3, `predict --model runs/X` still served epoch 1's export."""
    run = run_folder(tmp_path / "run", tiny_model(seed=1), epoch=1)
    export_into(run, capsys)
    run_folder(run, tiny_model(seed=2), epoch=3)  # the run moved on (a resume): model/ holds other weights
    img = tmp_path / "x.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(img)

    assert main(["predict", "--model", str(run / "model"), str(img), "--json"]) == 0
    want = json.loads(capsys.readouterr().out)[0]["top"]
    assert main(["predict", "--model", str(run), str(img), "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)[0]["top"] == want  # the run's model/, not the export beside it
    assert "holds an export" in cap.err and "means the run's model/" in cap.err
    assert main(["eval", "--model", str(run), "--data", str(plain_folder(tmp_path / "d")), "--json"]) == 0
    assert "(epoch 3" not in capsys.readouterr().out  # (--json: the numbers only)
    assert main(["eval", "--model", str(run), "--data", str(tmp_path / "d")]) == 0
    assert "(epoch 3 of its run)" in capsys.readouterr().out


def test_init_and_teacher_follow_the_same_rule(tmp_path, capsys):
    """`--init` read its checkpoint by a rule of its own: an architecture name was "not a public name", an export
    folder was read as a plain state dict. Both are refused as `--model` and `--teacher` refuse them."""
    run = run_folder(tmp_path / "run", tiny_model(tuple(str(i) for i in range(10))))
    exported = tmp_path / "exported"
    assert main(["export", "--model", str(run), "--out", str(exported), "--format", "torch", "--no-timing"]) == 0
    capsys.readouterr()
    out = ["--out", str(tmp_path / "ft"), "--epochs", "1", "--batch-size", "64", "--no-progress"]
    assert main(["finetune", "--init", "vit_ti16", *out]) == 2
    err = one_line_error(capsys, "finetune")
    assert "--init vit_ti16: a registered name is an untrained architecture" in err
    assert "its public weights are augreg_in21k_ft_in1k/vit_ti16 (downloaded when online)" in err  # timm's pretrained
    assert main(["finetune", "--init", "vit_small_patch16_dinov3", *out]) == 2
    assert "its public weights are timm/vit_small_patch16_dinov3.lvd1689m" in one_line_error(capsys, "finetune")
    assert main(["finetune", "--init", str(exported), *out]) == 2
    assert f"--init {exported}: an exported folder (vitlab export)" in one_line_error(capsys, "finetune")
    assert main(["train", "--teacher", str(exported), "--distill", "hard", *TINY, *out]) == 2
    assert f"--teacher {exported}: an exported folder (vitlab export)" in one_line_error(capsys, "train")


def test_plan_takes_a_run_folder(tmp_path, capsys):
    run = run_folder(tmp_path / "run", tiny_model())
    assert main(["plan", "--model", str(run), "--batch-size", "8", "--devices", "1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["img_size"] == 8 and plan["params"] == sum(p.numel() for p in tiny_model().parameters())
    assert main(["plan", "--model", str(run), "--img-size", "16", "--batch-size", "8", "--devices", "1"]) == 0
    assert "at 16 px" in capsys.readouterr().out


# --- defaults that follow the model -----------------------------------------------------------------------------


def test_eval_defaults_to_the_runs_own_data_and_the_split_it_held_out(tmp_path, capsys):
    """The issue's case: `vitlab eval --model runs/X` without --data took the digits ("class(es) 0, 1, 2, 3, 4
    unknown to the model"). It takes the run's data, and of a folder without val/ the 10% the run held out."""
    data = plain_folder(tmp_path / "photos")
    run = run_folder(tmp_path / "run", tiny_model(), data=str(data))
    assert main(["eval", "--model", str(run), "--cache-dir", str(tmp_path / "c"), "--json"]) == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert res["data"] == str(data) and res["count"] == 3  # ceil(0.1 x 30): the run's own hold-out, seed 0
    assert str(data) in cap.err and "held out" in cap.err
    # named: the same, never a number over the images that trained it (test_honest_numbers: the run's own number)
    assert main(["eval", "--model", str(run), "--data", str(data), "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "(val, 3 images)" in out and "held out of it (10% of each class, seed 0), the images" in out


def test_eval_of_a_plain_class_folder_evaluates_all_of_it_and_says_so(tmp_path, capsys):
    """The issue's case: given a folder without val/, eval silently evaluated a 10% hold-out (100 of 1,000)."""
    data = plain_folder(tmp_path / "photos")
    run = run_folder(tmp_path / "run", tiny_model())
    common = ["eval", "--model", str(run), "--data", str(data), "--cache-dir", str(tmp_path / "c")]
    assert main(common) == 0
    out = capsys.readouterr().out
    assert "(all, 30 images)" in out and "all 30 of its images were evaluated" in out
    assert main([*common, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 30
    assert main([*common, "--val-split", "0.2", "--json"]) == 0  # a held-out fraction, when asked for
    cap = capsys.readouterr()
    assert json.loads(cap.out)["count"] == 6 and "--val-split" in cap.err


def test_eval_of_a_test_folder_beside_train_is_no_plain_folder(tmp_path, capsys):
    """A run on DIR (train/, val/ and test/) says "test/ left alone for a final test: vitlab eval --model X --data
    DIR/test"; that command then noted "DIR/test has no val/ or test/ folder: all N of its images were evaluated",
    as if something were missing. An evaluation split given itself is evaluated whole without a note."""
    data = tmp_path / "photos"
    plain_folder(data / "train")
    shutil.copytree(data / "train", data / "test")
    run = run_folder(tmp_path / "run", tiny_model())
    assert main(["eval", "--model", str(run), "--data", str(data / "test"), "--cache-dir", str(tmp_path / "c")]) == 0
    cap = capsys.readouterr()
    assert "(all, 30 images)" in cap.out and "no val/ or test/ folder" not in cap.out + cap.err


def test_fewshot_defaults_to_the_runs_own_data(tmp_path, capsys):
    data = plain_folder(tmp_path / "photos")
    run = run_folder(tmp_path / "run", tiny_model(), data=str(data))
    assert main(["fewshot", "--model", str(run), "--shots", "1", "--seeds", "1", "--no-probe", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["data"] == str(data) and res["num_classes"] == 3


@pytest.mark.slow
def test_an_output_folder_is_never_read_as_data(tmp_path, capsys, monkeypatch):
    """The issue's case: `vitlab train --out digits` in an empty folder failed with "digits: no class folders"."""
    from vitlab.data.sources import data_folder
    from vitlab.train.engine.run_data import data_location

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--out", "digits", *TINY, "--epochs", "1", "--batch-size", "64", "--no-progress"]) == 0
    summary = json.loads((tmp_path / "digits" / "summary.json").read_text())
    assert summary["data"]["name"] == "digits" and summary["data"]["classes"] == 10
    assert data_location("digits") == "digits" and data_folder("digits") is None  # the name, not the folder
    (tmp_path / "cifar10").mkdir()  # a folder of a built-in name is given as a path
    assert data_folder("cifar10") is None and data_folder("./cifar10") == Path("cifar10")

    data = plain_folder(tmp_path / "photos")
    assert main(["train", "--data", str(data), "--out", str(data), *TINY, "--no-progress"]) == 2
    assert "an output folder is never read as data" in one_line_error(capsys, "train")
    assert main(["train", "--data", str(data), "--out", str(data / "run"), *TINY, "--no-progress"]) == 2
    assert "inside the data folder" in one_line_error(capsys, "train")
    assert not (data / "run").exists()
    assert main(["eval", "--model", "digits", "--data", "digits"]) == 0  # the run folder `digits`, on the digits
    capsys.readouterr()
    assert main(["eval", "--model", "digits", "--data", "./digits"]) == 2  # a run folder is no data set
    assert "a run folder (vitlab train --out wrote it), not a data set" in one_line_error(capsys, "eval")
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "always name the built-in data sets" in " ".join(capsys.readouterr().out.split())


# --- names from files, shown escaped; non-finite models -----------------------------------------------------------

ESC = "\x1b[2J\x1b]0;pwned\x07red"  # clear the screen, retitle the window
RLO = "b\u202eXYZ"  # right-to-left override


@pytest.mark.slow
def test_names_from_files_reach_the_terminal_escaped(tmp_path, capsys):
    data = plain_folder(tmp_path / "photos", classes=(ESC, RLO, "plain"))
    run = run_folder(tmp_path / "run", tiny_model((ESC, RLO, "plain")))
    img = tmp_path / "x.png"
    Image.new("RGB", (8, 8), (200, 10, 10)).save(img)

    def clean(text: str) -> None:
        assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text

    assert main(["predict", "--model", str(run), str(img)]) == 0
    out = capsys.readouterr().out
    clean(out)
    assert "\\x1b[2J" in out
    assert main(["eval", "--model", str(run), "--data", str(data), "--cache-dir", str(tmp_path / "c")]) == 0
    cap = capsys.readouterr()
    clean(cap.out + cap.err)
    assert "\\x1b[2J\\x1b]0;pwned\\x07red" in cap.out and "b\\u202eXYZ" in cap.out
    other = run_folder(tmp_path / "other", tiny_model(("x", "y", "z")))  # the folder's classes are unknown to it
    assert main(["eval", "--model", str(other), "--data", str(data), "--cache-dir", str(tmp_path / "c")]) == 2
    cap = capsys.readouterr()
    clean(cap.err)
    assert "unknown to the model" in cap.err
    # a run's lines: fine-tuning says which classes the checkpoint had
    digits = run_folder(tmp_path / "d", tiny_model((ESC, RLO, *(str(i) for i in range(8)))))
    args = ["finetune", "--init", str(digits), "--epochs", "1", "--out", str(tmp_path / "ft"), "--no-progress"]
    assert main([*args, "--batch-size", "64"]) == 0
    out = capsys.readouterr().out
    clean(out)
    assert "\\x1b[2J" in out


def test_names_a_stream_cannot_encode_are_escaped_not_an_error(tmp_path):
    """Where Python's streams are not UTF-8 (a latin-1 locale, ``PYTHONIOENCODING=ascii``, a redirected stream on
    Windows), a class folder named in Chinese or French ended ``predict``, ``eval`` and ``data check`` with
    ``vitlab predict: error: 'ascii' codec can't encode character '\\u51ac'``, after their work was done."""
    import os
    import subprocess
    import sys

    winter, summer = "\u51ac", "\xe9t\xe9"  # (the source stays ASCII)
    data = plain_folder(tmp_path / "photos", classes=(winter, summer), n=4)
    run = run_folder(tmp_path / "run", tiny_model((winter, summer)))
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    for args in (
        ["predict", "--model", str(run), str(next((data / winter).iterdir()))],
        ["data", "check", str(data)],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "vitlab", *args], env=env, capture_output=True, timeout=300, cwd=tmp_path
        )
        out, err = done.stdout.decode("ascii"), done.stderr.decode("ascii")  # ASCII, as the stream's encoding says
        assert done.returncode == 0, err
        assert "\\u51ac" in out and "codec can't encode" not in err, (out, err)


@pytest.mark.parametrize("command", ["inspect", "eval", "fewshot"])
def test_a_model_with_nan_weights_is_one_line(tmp_path, capsys, command):
    """The issue's case: `vitlab inspect` on a NaN model gave a traceback; eval reported nan as a result."""
    model = tiny_model(tuple(str(i) for i in range(10)))
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight[0, 0] = float("nan")
    run = run_folder(tmp_path / "run", model, data="digits")
    extra = {"inspect": ["--out", str(tmp_path / "i")], "eval": [], "fewshot": ["--shots", "1", "--seeds", "1"]}
    assert main([command, "--model", str(run), *extra[command]]) == 2
    err = one_line_error(capsys, command)
    assert "NaN or infinite" in err and "blocks.0.attn.qkv.weight" in err
    assert not (tmp_path / "i").exists() and not (run / "eval.json").exists()


def test_nan_outputs_are_an_error_in_eval_whatever_serves_them(tmp_path):
    """An exported graph has no weights to check: the logits it gives are (NaN accuracies were reported, exit 0)."""
    from vitlab.evaluate import evaluate_model

    model = tiny_model(tuple(str(i) for i in range(10)))
    model.register_forward_hook(lambda module, args, out: out * float("nan"))  # finite weights, NaN outputs
    with pytest.raises(vitlab.CheckpointError, match="outputs hold NaN or infinite values"):
        evaluate_model(model, "digits", progress=False)


def test_a_model_field_refused_is_named_by_the_commands_flag(capsys):
    """The library names the field and a remedy only Python has (``img_size: ... or dynamic_img_pad=True``); every
    command printed both, though none has such a flag. Now the line names the command's flag and leaves the Python
    remedy out."""
    with pytest.raises(vitlab.ConfigError, match=r"^img_size: 70x70 .* \(e\.g\. 64\) or dynamic_img_pad=True$"):
        vitlab.create_model("vit_ti16", img_size=70)
    for command in (["plan", "--model", "vit_ti16"], ["bench", "--model", "vit_ti16"]):
        assert main([*command, "--img-size", "70"]) == 2
        line = one_line_error(capsys, command[0])
        assert line.endswith(
            "error: --img-size: 70x70 is not divisible by the patch size 16; use a multiple of 16 (e.g. 64)"
        )

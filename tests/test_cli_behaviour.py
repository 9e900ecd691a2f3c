"""Commands behave alike and the way people work (issue 20): plain log lines off a terminal, outputs
where they belong, one rule for what a model argument accepts."""

from __future__ import annotations

import io
import json
import os
import re

import pytest

from conftest import copy_run
from vitlab.cli import main

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--patch-size", "4"]


@pytest.fixture
def run_dir(finished_digits_run, tmp_path_factory):
    """A copy of the suite's tiny digits run (tests/conftest.py: finished_digits_run, 2 epochs, trained once a
    session), outside ``tmp_path``: commands write next to it."""
    return copy_run(finished_digits_run, tmp_path_factory.mktemp("run"))


# --- one logger -------------------------------------------------------------------------------------------------


def test_progress_log_plain_lines_off_a_tty():
    from vitlab._progress import ProgressLog

    buf = io.StringIO()  # not a terminal
    log = ProgressLog(total=20, desc="train", every=5, stream=buf, quiet_s=0)
    for i in range(20):
        log.set_postfix(loss=f"{1 / (i + 1):.2f}")
        log.update(1)
    log.close()
    lines = buf.getvalue().splitlines()
    assert "\r" not in buf.getvalue()
    assert [ln.split()[2] for ln in lines] == ["5/20", "10/20", "15/20", "20/20"]
    assert "loss=0.05" in lines[-1]


def test_progress_log_says_nothing_of_a_job_that_ends_at_once():
    """Issue 36: a loop of 0 s printed 10 count lines off a terminal; it prints none within QUIET_S seconds, and
    counts as before (the last one at the close) once it has run that long."""
    from vitlab._progress import QUIET_S, ProgressLog

    buf = io.StringIO()
    with ProgressLog(total=20, desc="decoding", unit="img", stream=buf) as log:
        log.update(20)
    assert buf.getvalue() == ""
    log = ProgressLog(total=20, desc="decoding", unit="img", stream=buf)
    log.update(5)
    log._t0 -= QUIET_S  # as if QUIET_S seconds had passed
    log.update(5)
    log.update(3)
    log.close()
    assert [ln.split()[2] for ln in buf.getvalue().splitlines()] == ["10/20", "13/20"]


def test_progress_log_disabled_prints_nothing_but_lines(capsys):
    from vitlab._progress import ProgressLog

    buf = io.StringIO()
    log = ProgressLog(total=4, desc="x", every=1, enabled=False, stream=buf)
    log.update(4)
    log.line("epoch 1/1")
    log.close()
    assert buf.getvalue() == ""
    assert capsys.readouterr().out == "epoch 1/1\n"


def test_progress_log_of_a_silent_process_prints_nothing_at_all(capsys):
    """The other ranks under torchrun: no count lines and no lines (the trainer's mid-epoch lines, a re-plan's among
    them, go through its bar, which is silent there, instead of each call site asking which rank it is on)."""
    from vitlab._progress import ProgressLog

    buf = io.StringIO()
    log = ProgressLog(total=4, desc="x", every=1, stream=buf, quiet_s=0, silent=True)
    log.update(4)
    log.line("time budget: ... re-planned")
    log.close()
    assert buf.getvalue() == "" and capsys.readouterr().out == ""


@pytest.mark.slow
def test_train_no_progress_prints_a_line_per_epoch(capsys, tmp_path):
    out = tmp_path / "r"
    assert main(["train", "--epochs", "3", "--batch-size", "64", *TINY, "--out", str(out), "--no-progress"]) == 0
    cap = capsys.readouterr()
    epochs = [ln for ln in cap.out.splitlines() if ln.startswith("epoch ")]
    assert [ln.split()[1] for ln in epochs] == ["1/3", "2/3", "3/3"]
    assert "top-1" in epochs[0] and "train loss" in epochs[0]
    assert "\r" not in cap.err + cap.out


def test_counts_agree_with_their_number():
    from vitlab._units import counted

    assert [counted(1, "epoch"), counted(2, "epoch"), counted(0, "pass"), counted(1.5, "pass")] == [
        "1 epoch",
        "2 epochs",
        "0 passes",
        "1.5 passes",
    ]
    assert counted(1024, "image") == "1,024 images" and counted(3, "class") == "3 classes"
    assert counted(1.0, "shard") == "1 shard" and counted(2, "patch") == "2 patches"
    assert counted(2, "child", "children") == "2 children"


def test_a_duration_under_a_second_is_not_zero():
    """Before: a 13-step fine-tune of 4 ms steps said "expected wall time ~0 s"."""
    from vitlab._units import duration

    assert [duration(0.05), duration(0.42), duration(0.96), duration(45), duration(192)] == [
        "0.1 s",
        "0.4 s",
        "1 s",
        "45 s",
        "3.2 min",
    ]


@pytest.mark.slow
def test_train_of_one_epoch_says_one_epoch(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", "--epochs", "1", "--batch-size", "64", *TINY, "--out", str(out), "--no-progress"]) == 0
    last = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("top-1 ")][-1]
    assert " after 1 epoch / " in last and "epochs" not in last


@pytest.mark.slow
def test_train_off_a_tty_logs_plain_step_lines(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("vitlab._progress.QUIET_S", 0.0)  # a tiny run may end within the quiet period
    out = tmp_path / "r"
    assert main(["train", "--epochs", "2", "--batch-size", "64", *TINY, "--out", str(out)]) == 0
    cap = capsys.readouterr()
    assert "\r" not in cap.err  # no bar redraws in a log file
    steps = [ln for ln in cap.err.splitlines() if ln.startswith("train: ")]
    done, total = steps[-1].split()[2].split("/")
    assert steps[0].startswith("train: step ") and done == total
    assert sum(ln.startswith("epoch ") for ln in cap.out.splitlines()) == 2


# --- outputs where they belong ----------------------------------------------------------------------------------


def test_failed_train_leaves_no_empty_output_folder(tmp_path, capsys):
    out = tmp_path / "runs" / "x"
    assert main(["train", "--data", str(tmp_path / "missing"), *TINY, "--out", str(out), "--no-progress"]) == 2
    assert not (tmp_path / "runs").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    assert main(["train", "--data", str(tmp_path / "missing"), *TINY, "--out", str(kept), "--no-progress"]) == 2
    assert kept.is_dir()  # it was there before: not ours to remove


def test_default_run_folder_not_left_by_a_failure(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--data", "no/such/folder", *TINY, "--no-progress"]) == 2
    assert not (tmp_path / "runs").exists()


def test_saved_weights_follow_the_umask(tmp_path):
    import os

    import vitlab

    model = vitlab.create_model("vit_ti16", img_size=16, patch_size=8, depth=1, num_classes=3)
    old = os.umask(0o022)
    try:
        vitlab.save(model, tmp_path / "m")
        assert oct(os.stat(tmp_path / "m" / "model.safetensors").st_mode & 0o777) == oct(0o644)
        os.umask(0o077)
        vitlab.save(model, tmp_path / "p")
        assert oct(os.stat(tmp_path / "p" / "model.safetensors").st_mode & 0o777) == oct(0o600)
    finally:
        os.umask(old)


def test_trained_model_is_readable_by_others(run_dir):
    import os

    mode = os.stat(run_dir / "model" / "model.safetensors").st_mode & 0o777
    assert mode & 0o044 == os.stat(run_dir / "model" / "config.json").st_mode & 0o044


def test_save_to_a_file_name_is_refused(tmp_path):
    import vitlab

    model = vitlab.create_model("vit_ti16", img_size=16, patch_size=8, depth=1, num_classes=3)
    with pytest.raises(vitlab.CheckpointError, match="saved as a folder"):
        vitlab.save(model, tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()
    with pytest.raises(vitlab.CheckpointError, match=r"an ONNX file is written by vitlab export \(--out m.onnx\)"):
        vitlab.save(model, tmp_path / "m.onnx")  # (`vitlab convert SRC m.onnx`: the command that writes one)


def test_fewshot_default_output_next_to_the_model(run_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["fewshot", "--model", str(run_dir), "--shots", "1", "--seeds", "1", "--no-probe", "--max-test", "50"]
    assert main(args) == 0
    assert (run_dir / "fewshot.json").is_file() and not (tmp_path / "fewshot.json").exists()
    assert main(["fewshot", "--model", "vit_ti16", "--img-size", "16", *args[3:]]) == 0
    assert "not written" in capsys.readouterr().out and not (tmp_path / "fewshot.json").exists()


@pytest.mark.parametrize("command", ["eval", "fewshot", "inspect"])
def test_no_progress_reaches_the_commands_loops(command, run_dir, tmp_path, monkeypatch):
    """``--no-progress``, as ``vitlab train`` and ``vitlab data`` take it, turns off every progress log the command
    opens (before: eval, fewshot and inspect refused it as an unrecognised argument)."""
    from vitlab._progress import ProgressLog

    enabled = []
    init = ProgressLog.__init__

    def watched(self, *args, **kwargs):
        enabled.append(kwargs.get("enabled", True))
        init(self, *args, **kwargs)

    monkeypatch.setattr(ProgressLog, "__init__", watched)
    out = str(tmp_path / "out")
    argv = {
        "eval": ["eval", "--model", str(run_dir), "--output", str(tmp_path / "e.json")],
        "fewshot": ["fewshot", "--model", str(run_dir), "--shots", "1", "--seeds", "1", "--no-probe",
                    "--max-test", "50", "--out", str(tmp_path / "f.json")],
        "inspect": ["inspect", "--model", str(run_dir), "--num-images", "2", "--show", "1", "--batch-size", "1",
                    "--out", out],
    }[command]  # fmt: skip
    assert main([*argv, "--no-progress"]) == 0
    assert enabled and not any(enabled), enabled


def test_export_default_output_next_to_the_model(run_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--model", str(run_dir), "--format", "torchscript", "--no-timing"]) == 0
    assert (run_dir / "export-torchscript" / "model.pt").is_file() and not list(tmp_path.iterdir())
    assert main(["export", "--model", str(run_dir), "--format", "torchscript"]) == 2  # exists: not replaced silently
    assert main(["export", "--model", str(run_dir), "--format", "torchscript", "--overwrite", "--no-timing"]) == 0


# --- one rule for a model argument ------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_command_accepts_a_run_folder(run_dir, tmp_path, capsys):
    from PIL import Image

    import vitlab

    model = vitlab.load(run_dir)
    assert model.config.num_classes == 10
    img = tmp_path / "x.png"
    Image.new("L", (8, 8), 128).save(img)
    assert main(["eval", "--model", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] > 0
    assert (run_dir / "eval.json").is_file()
    assert main(["predict", "--model", str(run_dir), str(img), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["image"] == str(img)
    assert main(["convert", str(run_dir), str(tmp_path / "conv")]) == 0
    ft = tmp_path / "ft"
    assert main(["finetune", "--init", str(run_dir), "--epochs", "1", "--out", str(ft), "--no-progress"]) == 0
    assert (ft / "model" / "model.safetensors").is_file()


def test_predict_a_folder_reports_unreadable_files_and_predicts_the_rest(run_dir, tmp_path, capsys):
    from PIL import Image

    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    for name in ("a.png", "sub/b.png"):
        Image.new("L", (8, 8), 200).save(folder / name)
    (folder / "broken.jpg").write_bytes(b"not an image")
    assert main(["predict", "--model", str(run_dir), str(folder), "--json"]) == 1
    cap = capsys.readouterr()
    res = {r["image"]: r for r in json.loads(cap.out)}
    assert len(res) == 3
    assert "top" in res[str(folder / "a.png")] and "top" in res[str(folder / "sub" / "b.png")]
    assert "not a readable image" in res[str(folder / "broken.jpg")]["error"]
    assert "broken.jpg" in cap.err
    assert main(["predict", "--model", str(run_dir), str(folder / "broken.jpg")]) == 2  # nothing readable: an error


def test_predict_expands_a_quoted_pattern_and_names_a_url_or_stdin(run_dir, tmp_path, capsys, monkeypatch):
    """A pattern the shell did not expand (quoted, or a Windows shell) was "no such file or folder", a URL too (its
    `//` folded into `/` by Path), and `-` the same. A pattern is expanded as the shell would, sorted; a URL and
    standard input say what they are; a file whose name holds a pattern's characters is still that file."""
    from PIL import Image

    for name in ("a1.png", "a2.png", "b1.png", "[x].png"):
        Image.new("L", (8, 8), 200).save(tmp_path / name)
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--model", str(run_dir), "a*.png", "--json"]) == 0
    assert [r["image"] for r in json.loads(capsys.readouterr().out)] == ["a1.png", "a2.png"]
    assert main(["predict", "--model", str(run_dir), "[x].png", "--json"]) == 0  # the file, not a pattern
    assert [r["image"] for r in json.loads(capsys.readouterr().out)] == ["[x].png"]
    for arg, said in (("c*.png", "c*.png: no file or folder matches this pattern"),
                      ("https://example.com/cat.jpg", "https://example.com/cat.jpg: a URL; vitlab reads image files"),
                      ("-", "-: standard input is not read")):  # fmt: skip
        assert main(["predict", "--model", str(run_dir), arg]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1


# --- the command line's words -----------------------------------------------------------------------------------


def test_train_unknown_model_suggests_close_names(tmp_path, capsys):
    assert main(["train", "--model", "vit_tiny16", "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "did you mean vit_ti16" in err and err.startswith("vitlab train: error:")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("flag", "ours"),
    [(["-b", "32"], "--batch-size"), (["--output", "x"], "--out"), (["--smoothing", "0.1"], "--label-smoothing")],
)
def test_timm_flags_get_the_vitlab_spelling_under_train_usage(flag, ours, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", *flag])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: vitlab train" in err and f"vitlab spells it {ours}" in err


def test_pretrained_points_at_finetune(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--pretrained"])
    assert "vitlab finetune --init" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["train", "finetune", "eval", "predict", "inspect", "fewshot", "export", "convert"])
def test_help_has_no_empty_or_doubled_defaults(cmd, capsys):
    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # line breaks of the help layout removed
    assert "(default: None)" not in text and "(default: False)" not in text
    assert not re.search(r"default[^()]*\) \(default:", text)  # a help that names its default gets no second one
    assert "../shared" not in text
    if cmd in ("train", "finetune"):
        assert "--epochs EPOCHS passes over the training data" in text
    if cmd == "export":
        assert "runs/cifar/best" not in text


def test_cifar_offline_error_points_at_no_private_path(monkeypatch, tmp_path):
    from torchvision import datasets

    from vitlab.data.sources import _cifar
    from vitlab.errors import OfflineError

    def offline(*a, **k):
        raise OSError("no network")

    monkeypatch.setattr(datasets, "CIFAR10", offline)
    with pytest.raises(OfflineError) as e:
        _cifar("cifar10", tmp_path)
    assert "../shared" not in str(e.value) and "ImageFolder" in str(e.value)


def test_a_library_warning_is_one_line_under_the_command_once(tmp_path, capsys):
    """Before: ``vitlab convert`` (and ``finetune --init``) of a bare state dict printed Python's warning, the file and
    line of vitlab's source with the source line under it, once for each place that read the checkpoint."""
    import torch
    from safetensors.torch import save_file

    import vitlab
    from vitlab.cli import _warning_lines

    m = vitlab.create_model("vit_ti16", img_size=16, patch_size=4, embed_dim=48, depth=1, num_heads=2, num_classes=0)
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, tmp_path / "bare.safetensors")
    assert main(["convert", str(tmp_path / "bare.safetensors"), str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("vitlab convert: warning: width 48 is not in the paper's table"), err
    assert "--num-heads" in err[0]
    assert main(["convert", str(tmp_path / "bare.safetensors"), str(tmp_path / "o2"), "--num-heads", "2"]) == 0
    assert not capsys.readouterr().err
    with torch.no_grad():
        assert torch.equal(vitlab.load(tmp_path / "o2").blocks[0].attn.qkv.weight, m.blocks[0].attn.qkv.weight)
    show = _warning_lines("predict")
    for _ in range(2):  # the same text from two places: once; what it quotes from a file: escaped
        show(UserWarning("class \x1b[2Jname\nover two lines"), UserWarning, "f.py", 1)
    assert capsys.readouterr().err == "vitlab predict: warning: class \\x1b[2Jname over two lines\n"


# --- offline ----------------------------------------------------------------------------------------------------


def test_convert_offline_fails_fast_and_names_hf_hub_offline(monkeypatch, tmp_path, capsys):
    import time

    huggingface_hub = pytest.importorskip("huggingface_hub")
    from vitlab.checkpoints import hub

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    calls = []

    def cache_only(*, repo_id, filename, local_files_only=False, **kw):
        calls.append(local_files_only)
        if not local_files_only:
            time.sleep(30)  # what huggingface_hub's retries would cost
        raise huggingface_hub.errors.LocalEntryNotFoundError("not in the cache")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cache_only)
    monkeypatch.setattr(hub, "_unreachable", lambda endpoint, **kw: "huggingface.co:443 cannot be reached")
    t0 = time.perf_counter()
    assert main(["convert", "augreg_in21k/vit_b16", str(tmp_path / "out")]) == 2
    assert time.perf_counter() - t0 < 5
    err = capsys.readouterr().err
    assert "HF_HUB_OFFLINE=1" in err and "cannot be reached" in err and err.count("\n") == 1
    assert calls and all(calls)  # the cache was asked, never the network
    assert not (tmp_path / "out").exists()


def test_unreachable_probe_is_quick_and_local(monkeypatch):
    import socket

    from vitlab.checkpoints import hub

    monkeypatch.undo()  # the real probe, with the connection itself stood in for
    for v in hub._PROXY_VARS:
        monkeypatch.delenv(v, raising=False)

    def refuse(addr, timeout):
        assert timeout <= 5
        raise ConnectionRefusedError("refused")

    monkeypatch.setattr(socket, "create_connection", refuse)
    assert "cannot be reached" in hub._unreachable("https://huggingface.co")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert hub._unreachable("https://huggingface.co") is None  # a proxy: only the download can tell


# --- fine-tuning says what it did -------------------------------------------------------------------------------


@pytest.mark.slow
def test_finetune_prints_its_start(run_dir, tmp_path, capsys):
    ft = ["finetune", "--init", str(run_dir), "--epochs", "1", "--no-progress"]
    assert main([*ft, "--img-size", "16", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert f"fine-tuning from {run_dir}" in out
    assert "position embeddings resampled 2x2 -> 4x4" in out
    assert "head kept: the same 10 classes in the same order" in out
    before = re.search(r"before fine-tuning, at 16x16: top-1 ([\d.]+)% on \w+", out)
    assert before and 0.0 <= float(before.group(1)) <= 100.0
    assert main([*ft, "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "position embeddings kept (2x2 patches)" in out


# --- top-5 only where it means something ------------------------------------------------------------------------


@pytest.mark.slow
def test_no_top5_with_five_classes_or_fewer(tmp_path, capsys, monkeypatch):
    from imagefolder import tiny_folder

    data = tiny_folder(tmp_path / "d")
    out = tmp_path / "r"
    common = ["--data", str(data), "--cache-dir", str(tmp_path / "c"), "--recipe", "digits", "--batch-size", "8"]
    assert main(["train", *common, *TINY, "--epochs", "1", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "epoch 1/1" in text and "top-1" in text and "top-5" not in text
    assert main(["eval", "--model", str(out), "--data", str(data), "--cache-dir", str(tmp_path / "c")]) == 0
    assert "top-5" not in capsys.readouterr().out

    import matplotlib.axes

    labels = []
    real = matplotlib.axes.Axes.plot
    monkeypatch.setattr(
        matplotlib.axes.Axes, "plot", lambda self, *a, **k: labels.append(k.get("label")) or real(self, *a, **k)
    )
    from vitlab.train.persist.figures import plot_curves
    from vitlab.train.persist.outputs import read_metrics

    plot_curves(read_metrics(out / "metrics.jsonl"), tmp_path / "c3.png", num_classes=3)
    assert "top-1" in labels and "top-5" not in labels
    plot_curves(read_metrics(out / "metrics.jsonl"), tmp_path / "c10.png", num_classes=10)
    assert "top-5" in labels


# --- the inspection report says what it shows -------------------------------------------------------------------


@pytest.mark.slow
def test_inspect_says_random_weights_and_which_images(run_dir, tmp_path, capsys):
    args = ["--num-images", "2", "--show", "1"]
    assert main(["inspect", "--model", "vit_ti16", "--img-size", "16", *args, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "weights are random" in out and "embedded scikit-learn digits" in out
    report = (tmp_path / "a" / "report.html").read_text()
    assert "weights are random" in report
    assert "weights are random" in json.loads((tmp_path / "a" / "inspect.json").read_text())["notes"][0]

    assert main(["inspect", "--model", str(run_dir), *args]) == 0  # default: next to the model
    out = capsys.readouterr().out
    assert "weights are random" not in out
    assert (run_dir / "inspect" / "report.html").is_file()


def test_inspect_uses_the_data_the_model_was_trained_on(run_copy, finished_run_data, capsys):
    data, run = finished_run_data, run_copy  # the suite's tiny run on a generated folder (inspect writes next to it)
    assert main(["inspect", "--model", str(run), "--num-images", "2", "--show", "1", "--json"]) == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out)  # the notes went to stderr: stdout is the JSON alone
    assert str(data) in res["notes"][0] and str(data) in cap.err
    assert set(res["images"]) <= {"class0", "class1", "class2"}


def _recorded(tmp_path, data):
    """A run folder whose model/ records ``data`` as the run's ``--data`` (as `vitlab train` writes it)."""
    import vitlab

    run = tmp_path / "run"
    m = vitlab.VisionTransformer(img_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_dim=16)
    vitlab.save(m, run / "model", extra={} if data is None else {"data": data})
    return run


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ("GONE", "which is not a folder here"),  # the run's data folder moved away
        ("photos", "a path relative to the folder training ran in"),  # recorded relative: from where?
        (None, "records no training data"),  # a model saved from Python: no data of its own
    ],
)
def test_inspect_never_switches_to_other_data_when_the_runs_data_is_missing(tmp_path, capsys, monkeypatch, data, says):
    """Issue 36: a run's data not found at inspect time is one line naming --data, not figures drawn on the embedded
    digits with a note; nothing is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    run = _recorded(tmp_path / "elsewhere", str(tmp_path / "gone") if data == "GONE" else data)
    out = tmp_path / "insp"
    assert main(["inspect", "--model", str(run), "--num-images", "2", "--show", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitlab inspect: error: --data: ") and err.count("\n") == 1
    assert says in err and "--data digits" in err
    assert not out.exists()
    # asked for by name, the digits are used, and the report says so
    assert (
        main(
            ["inspect", "--model", str(run), "--data", "digits", "--num-images", "2", "--show", "1", "--out", str(out)]
        )
        == 0
    )
    assert (out / "report.html").is_file()


def test_report_summary_numbers_are_rounded(tmp_path):
    from vitlab.inspect.report import training_artifacts

    (tmp_path / "summary.json").write_text(json.dumps({"wall_s": 32.458161920000066, "steps": 40, "top1": 0.5}))
    _, sections = training_artifacts(tmp_path)
    assert sections[0].table == {"wall_s": 32.46, "steps": 40, "top1": 0.5}


def test_fig6_mask_shows_contrast_and_the_heatmap_has_a_colour_bar():
    import matplotlib.pyplot as plt
    import torch

    from vitlab.inspect import figures

    maps = torch.full((1, 2, 2), 0.9)
    maps[0, 0, 0] = 1.0  # a nearly uniform rollout, as the residual term makes it
    masks = figures.rollout_masks(maps, (8, 8))
    assert masks.min() == pytest.approx(0.0, abs=1e-6) and masks.max() == pytest.approx(1.0, rel=1e-6)
    fig = figures.plot_rollout(torch.ones(1, 8, 8, 3), maps)
    masked = fig.axes[1].images[0].get_array()
    assert float(masked.min()) < 0.2  # the masked image is no copy of the input
    heat = fig.axes[2].images[0]
    assert heat.get_cmap().name == figures.ROLLOUT_CMAP != "jet"
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes)
    assert fig.axes[0].title.get_fontsize() >= 10
    plt.close(fig)


def test_report_images_all_decode(run_dir, tmp_path, capsys):
    """Without a browser: every <img> of report.html is an embedded PNG that decodes (no broken image)."""
    import base64
    import io as _io

    from PIL import Image

    out = tmp_path / "insp"
    assert main(["inspect", "--model", str(run_dir), "--num-images", "2", "--show", "2", "--out", str(out)]) == 0
    page = (out / "report.html").read_text()
    srcs = re.findall(r'<img alt="[^"]*" src="([^"]+)"', page)
    assert len(srcs) == page.count("<img") >= 5  # Fig. 6 and 7, the curves and the confusion matrix
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        im = Image.open(_io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        im.verify()


def test_eval_decodes_the_evaluation_split_alone(
    finished_run, finished_run_data, run_copy, tmp_path, capsys, monkeypatch
):
    """``vitlab eval`` on a train/ + val/ folder decodes val/ only: the first eval after training
    used to decode the training split again (at the eval size, a new cache)."""
    import shutil

    import vitlab.data.sources as sources

    data, out = finished_run_data, run_copy  # the suite's tiny run (eval writes into it) and its data
    shutil.copytree(finished_run.parent / "cache", tmp_path / "c")  # the decode cache its training left
    decoded: list[str] = []
    real = sources.decode_files

    def spy(paths, **kw):
        decoded.extend(paths)
        return real(paths, **kw)

    monkeypatch.setattr(sources, "decode_files", spy)
    capsys.readouterr()
    assert main(["eval", "--model", str(out), "--data", str(data), "--cache-dir", str(tmp_path / "c")]) == 0
    assert decoded and not any(f"{os.sep}train{os.sep}" in p for p in decoded)
    ev = json.loads((out / "eval.json").read_text())  # written into the folder given
    assert ev["count"] == len(decoded) - len(ev["skipped_files"])


def _browser() -> str | None:
    import shutil

    return next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.skipif(_browser() is None, reason="no Chromium installed (Debian: apt-get install chromium)")
def test_report_renders_in_a_real_browser_with_no_broken_image(run_dir, tmp_path, capsys):
    """report.html opened by headless Chromium: the load event sees every figure decoded (a probe script
    writes the count into the title, which --dump-dom prints); a page with a broken image reads 1."""
    import subprocess

    out = tmp_path / "insp"
    assert main(["inspect", "--model", str(run_dir), "--num-images", "2", "--show", "2", "--out", str(out)]) == 0
    page = (out / "report.html").read_text()
    probe = (
        "<script>window.addEventListener('load', () => { const im = [...document.images]; "
        "document.title = 'images ' + im.length + ' broken ' + "
        "im.filter(i => !i.complete || i.naturalWidth === 0).length; });</script>"
    )

    def render(html: str) -> tuple[str, str]:
        f = tmp_path / "probe.html"
        f.write_text(html.replace("</body>", probe + "</body>"))
        cmd = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
        dom = subprocess.run([*cmd, "--dump-dom", f.as_uri()], capture_output=True, text=True, timeout=120).stdout
        m = re.search(r"<title>images (\d+) broken (\d+)</title>", dom)
        assert m, dom[-2000:]
        return m.group(1), m.group(2)

    images, broken = render(page)
    assert int(images) >= 5 and broken == "0"
    bad = page.replace("</body>", '<img alt="x" src="data:image/png;base64,AAAA"></body>')
    assert render(bad)[1] == "1"  # the probe does see a broken image


def test_resuming_a_finished_run_rewrites_nothing(run_copy, capsys):
    """`vitlab train --out RUN --resume` of a run that has finished trained nothing, yet rewrote its summary.json
    (the wall time grown by the resume's start-up, the attention watch's passes at 0, the calibration of model/
    dropped), config.yaml, sizing.json and figures. Now its checkpoint and data are checked as every resume's, and
    the summary is returned as the run wrote it: no file changes, no result is written again."""
    files = sorted(p for p in run_copy.rglob("*") if p.is_file())
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes()) for p in files}
    assert main(["train", "--out", str(run_copy), "--resume", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "the run is already complete (6 steps); nothing to resume" in out
    assert "top-1 " in out and "results in " in out  # the summary's lines, from summary.json as the run wrote it
    assert sorted(p for p in run_copy.rglob("*") if p.is_file()) == files
    assert not [p.name for p in files if p.read_bytes() != before[p][2]]  # no file changes
    kept = [p for p in files if p.name not in ("data_check.json", "metrics.jsonl")]  # (every resume checks them)
    assert not [p.name for p in kept if (p.stat().st_ino, p.stat().st_mtime_ns) != before[p][:2]]  # none written


@pytest.mark.parametrize("cmd", ["eval --data digits", "fewshot --data digits", "inspect", "bench"])
def test_a_batch_size_of_zero_is_one_line_alike_in_every_command(cmd, capsys):
    """Each command said it otherwise ("batch_size and steps must be positive and warmup >= 0, got 0, 10, 2",
    "batch_size: must be positive", ...), and `vitlab eval` let PyTorch's DataLoader say it."""
    with pytest.raises(SystemExit) as e:  # (argparse's exit: at parsing, before any model is built)
        main([*cmd.split(), "--model", "vit_ti16", "--batch-size", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("error: argument --batch-size: must be a positive whole number, got 0"), err  # (usage 1st)
    assert err[0].startswith("usage: vitlab ") and not any("Traceback" in line for line in err)


def test_suggested_command_lines_can_be_copied_whatever_the_path(tmp_path, capsys):
    """A line vitlab suggests (``train from it: --data X``, ``Continue with: vitlab train --out X --resume``,
    ``train with --out X first``) quotes a path the shell would split or expand; before, ``--data out dir {x}/shards``
    was three words and a brace expansion. A plain path stays as it is."""
    import shlex
    from pathlib import Path

    from imagefolder import tiny_folder
    from vitlab.train.engine.messages import stopped_line
    from vitlab.train.persist.position import RunPosition

    odd = tmp_path / "out dir {x} $HOME 100%"
    data = tiny_folder(tmp_path / "photos", per_class=2, test_per_class=1)
    assert main(["data", "pack", str(data), str(odd / "shards"), "--no-progress"]) == 0
    said = capsys.readouterr().out.splitlines()[-1]
    assert shlex.split(said.split("train from it: ", 1)[1]) == ["--data", str(odd / "shards")], said

    line = stopped_line(RunPosition(epoch=1, step=4), by="SIGINT", saved=odd / "last.pt", out=odd)
    assert shlex.split(line.split("Continue with: ", 1)[1]) == ["vitlab", "train", "--out", str(odd), "--resume"]
    plain = stopped_line(RunPosition(), by=None, saved=Path("runs/x/last.pt"), out=Path("runs/x"))
    assert plain.endswith("Continue with: vitlab train --out runs/x --resume")

    assert main(["train", "--out", str(odd / "run"), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert shlex.split(err.split("(train with ", 1)[1].split(" first)")[0]) == ["--out", str(odd / "run")], err

"""Calibrated probabilities (issue 59, deliverable 4): the temperature fit (temperature scaling, Guo et al. 2017)
recovers a known temperature, the ECE matches hand-computed cases, a temperature never changes a prediction, it
travels with the model through save / load / export (a bad one is ignored with a warning), ``vitlab predict`` gives
the calibrated probabilities unless ``--uncalibrated``, and a training run fits one on images other than those it
reports the ECE on, writing it into ``model/config.json``, ``summary.json``, ``vitlab eval --json`` and the report."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import vitlab
from conftest import assert_close_rel
from imagefolder import tiny_folder
from vitlab.checkpoints import save
from vitlab.cli import main
from vitlab.data.images.user_files import read_image
from vitlab.evaluate import model_inputs
from vitlab.evaluate.calibration import (
    ECE_BINS,
    T_MIN,
    LogitKeeper,
    bake_temperature,
    calibrate,
    checked_temperature,
    expected_calibration_error,
    fit_temperature,
    model_temperature,
    probabilities,
    temperature_pays,
)
from vitlab.inspect.report import training_artifacts
from vitlab.models import VisionTransformer

TINY = dict(img_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_dim=32)
TRAIN = ["--img-size", "8", "--patch-size", "4", "--dim", "16", "--depth", "1", "--heads", "2", "--no-progress"]


def _model(temperature=None, *, seed: int = 0, dist_token: bool = False) -> VisionTransformer:
    """A tiny ViT with a random (not zero) head, so its logits differ between classes."""
    torch.manual_seed(seed)
    extra = {} if temperature is None else {"temperature": temperature}
    model = VisionTransformer(**TINY, num_classes=3, class_names=["a", "b", "c"], dist_token=dist_token, extra=extra)
    heads = [model.head] + ([model.head_dist] if dist_token else [])
    with torch.no_grad():
        for h in heads:
            h.weight.normal_(0, 1.0)
            h.bias.normal_(0, 0.5)
    return model.eval()


# -- the fit and the ECE --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t0", [0.5, 1.0, 2.5])
def test_the_fit_recovers_a_known_temperature(t0):
    """Labels drawn from softmax(z): the logits z * t0 are t0 times too sharp, and T = t0 undoes it exactly."""
    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(20_000, 10, generator=g)
    y = torch.multinomial(z.softmax(1), 1, generator=g)[:, 0]
    t = fit_temperature(z * t0, y)
    assert abs(t - t0) / t0 < 0.05, t
    # the fitted T is the NLL's minimum: a little either side is worse
    nll = lambda s: float(torch.nn.functional.cross_entropy(z * t0 / s, y))  # noqa: E731
    assert nll(t) <= min(nll(t * 1.05), nll(t / 1.05))


def test_the_fit_says_1_where_nothing_can_be_fitted():
    y = torch.tensor([0, 1, 2, 1])
    assert fit_temperature(torch.zeros(4, 3), y) == 1.0  # logits that ignore the class: every T is as good
    assert fit_temperature(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)) == 1.0  # no images
    assert fit_temperature(torch.randn(4, 1), torch.zeros(4, dtype=torch.long)) == 1.0  # one class
    # separable and all right: sharper is always better, up to the search's bound
    assert fit_temperature(torch.eye(3) * 5, torch.arange(3)) == T_MIN
    # a non-finite row is left out, not a NaN temperature
    z = torch.tensor([[2.0, 0.0], [float("nan"), 1.0], [0.0, 2.0], [1.0, 0.0]])
    assert math.isfinite(fit_temperature(z, torch.tensor([0, 1, 1, 1])))


def test_ece_on_hand_computed_cases():
    """15 bins over (0, 1]: 0.95 is in (14/15, 1], 0.85 in (12/15, 13/15], 0.55 and 0.56 in (8/15, 9/15]."""

    def probs(conf):  # two classes: class 0 with probability c
        c = torch.tensor(conf, dtype=torch.float64)
        return torch.stack([c, 1 - c], 1)

    p = probs([0.95, 0.85, 0.55, 0.56])
    y = torch.tensor([0, 1, 0, 1])  # right, wrong, right, wrong
    want = (abs(1 - 0.95) + abs(0 - 0.85) + abs(1 - (0.55 + 0.56))) / 4  # = 0.2525
    assert expected_calibration_error(p, y) == pytest.approx(want, rel=1e-6)
    assert expected_calibration_error(probs([1.0, 1.0]), torch.tensor([0, 0])) == 0.0  # sure and right
    assert expected_calibration_error(probs([1.0, 1.0]), torch.tensor([1, 1])) == pytest.approx(1.0)  # sure, wrong
    # one bin, (7/15, 8/15], for 0.5 and 0.52: its accuracy 1/2 against its mean confidence 0.51
    assert expected_calibration_error(probs([0.5, 0.52]), torch.tensor([0, 1])) == pytest.approx(abs(1 - 1.02) / 2)
    # apart, in (8/15, 9/15] and (9/15, 10/15]: each its own gap
    assert expected_calibration_error(probs([0.55, 0.65]), torch.tensor([0, 1])) == pytest.approx((0.45 + 0.65) / 2)
    assert expected_calibration_error(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long)) is None
    assert ECE_BINS == 15


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**16), classes=st.integers(2, 12), t=st.floats(0.1, 10.0), scale=st.floats(0.5, 20.0))
def test_a_temperature_never_changes_the_top1(seed, classes, t, scale):
    """T > 0 divides every logit of an image alike: the argmax stays (so does top-1 accuracy), and the fitted
    temperature's probabilities predict what the plain softmax predicts."""
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(64, classes, generator=g)
    y = torch.randint(0, classes, (64,), generator=g)
    for temperature in (t, calibrate(z, y).temperature):
        p = probabilities(z, temperature)
        assert torch.equal(p.argmax(1), z.argmax(1))
        assert torch.allclose(p.sum(1), torch.ones(64), atol=1e-5)


def test_calibrate_fits_on_every_other_image_and_measures_on_the_rest():
    """The temperature depends only on the even positions; the ECE reported only on the odd ones."""
    g = torch.Generator().manual_seed(1)
    z = 4 * torch.randn(400, 5, generator=g)
    y = torch.multinomial((z / 4).softmax(1), 1, generator=g)[:, 0]
    cal = calibrate(z, y)
    assert cal.temperature == fit_temperature(z[0::2], y[0::2])
    assert (cal.fit_images, cal.ece_images) == (200, 200)
    assert cal.ece == pytest.approx(expected_calibration_error(probabilities(z[1::2], cal.temperature), y[1::2]))
    assert cal.ece_uncalibrated == pytest.approx(expected_calibration_error(probabilities(z[1::2]), y[1::2]))
    assert cal.ece < cal.ece_uncalibrated  # 4x too sharp: calibration helps on images that did not fit it
    z2 = z.clone()
    z2[1::2] = torch.randn(200, 5, generator=g)  # other reporting images: the same temperature
    assert calibrate(z2, y).temperature == cal.temperature
    d = cal.to_dict()
    assert sum(d["reliability"]["count"]) == 200 and "every other image" in d["held_out"]
    assert d["fitted_temperature"] == cal.fitted == cal.temperature  # it paid out of sample
    json.dumps(d)  # a record for files


def test_a_temperature_that_does_not_pay_out_of_sample_is_not_kept():
    """The fitting half's NLL picks some T != 1 even where no one T holds: here a quarter of the images (every fourth,
    half of the fitting half) are 4x too sharp and the rest calibrated (labels drawn from their own softmax), so T
    fitted on one half of the fitting images makes the other half's NLL worse, and the model keeps T = 1 and records
    the fitted one. Logits 4x too sharp everywhere keep theirs. Only the fitting half decides."""
    g = torch.Generator().manual_seed(3)
    z = 2 * torch.randn(400, 5, generator=g)
    y = torch.multinomial(z.softmax(1), 1, generator=g)[:, 0]
    mixed = z.clone()
    mixed[0::4] *= 4
    cal = calibrate(mixed, y)
    assert cal.fitted > 1.2 and cal.temperature == 1.0 and not temperature_pays(mixed[0::2], y[0::2])
    assert cal.ece == cal.ece_uncalibrated and cal.to_dict()["fitted_temperature"] == cal.fitted
    sharp = calibrate(4 * z, y)
    assert sharp.temperature == sharp.fitted == pytest.approx(4.0, rel=0.3) and temperature_pays(4 * z[0::2], y[0::2])
    reported = mixed.clone()
    reported[1::2] = 5 * torch.randn(200, 5, generator=g)  # the reporting half changed: the same choice
    assert calibrate(reported, y).temperature == 1.0


def test_the_kept_logits_are_bounded_and_spread_over_the_whole_split():
    keeper = LogitKeeper(max_values=100 * 3)
    for start in range(0, 1000, 64):  # 1,000 images of 3 classes in batches of 64
        n = min(64, 1000 - start)
        keeper.add(torch.arange(start, start + n).float()[:, None].repeat(1, 3), torch.arange(start, start + n) % 3)
    z, y = keeper.result()
    assert len(z) * 3 <= 300 and len(z) >= 50
    first = z[:, 0].long()
    assert torch.equal(first, torch.arange(0, 1000, keeper.stride))  # every stride-th image, in order, to the end
    assert torch.equal(y, first % 3)
    small = LogitKeeper()
    small.add(torch.randn(10, 4), torch.arange(10) % 4)
    assert len(small.result()[0]) == 10  # under the bound: every image


# -- the temperature with the model ---------------------------------------------------------------------------------


def test_a_temperature_is_data_checked_as_it_is_read(tmp_path):
    assert checked_temperature(2) == 2.0 and checked_temperature(0.7) == 0.7
    for bad in (0, -1.0, float("nan"), float("inf"), "2.0", True, None, [1.0]):
        assert checked_temperature(bad) is None
    assert model_temperature(_model()) == 1.0  # no temperature: T = 1, silently
    assert model_temperature(_model(2.5)) == 2.5
    model = _model(2.5)
    save(model, tmp_path / "good")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a good temperature loads without a word
        back = vitlab.load(tmp_path / "good")
    assert model_temperature(back) == 2.5
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(back(x).argmax(1), model(x).argmax(1))
    for bad in ("hot", -2.0, 0):
        cfg_path = tmp_path / "good" / "config.json"
        raw = json.loads(cfg_path.read_text())
        raw["extra"]["temperature"] = bad
        cfg_path.write_text(json.dumps(raw))
        with pytest.warns(UserWarning, match="temperature .* is not a finite positive number; ignored"):
            loaded = vitlab.load(tmp_path / "good")
        assert model_temperature(loaded) == 1.0 and "temperature" not in loaded.config.extra
    raw["extra"]["temperature"] = None  # null: none was fitted (a run that fitted none writes it)
    cfg_path.write_text(json.dumps(raw))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model_temperature(vitlab.load(tmp_path / "good")) == 1.0


@pytest.mark.parametrize("dist_token", [False, True])
def test_baking_divides_the_logits_and_leaves_the_model(dist_token):
    model = _model(2.5, dist_token=dist_token)
    x = torch.randn(4, 3, 8, 8)
    before = model(x)
    baked = bake_temperature(model, 2.5)
    assert_close_rel(baked(x), before / 2.5)
    assert torch.equal(model(x), before)  # the model itself is untouched


def test_predict_gives_calibrated_probabilities_unless_uncalibrated(tmp_path, capsys):
    model = _model(3.0)
    save(model, tmp_path / "m")
    img = np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    from PIL import Image

    Image.fromarray(img).save(tmp_path / "x.png")
    with torch.no_grad():
        logits = model(model_inputs(model, [read_image(tmp_path / "x.png")]))[0]

    def top(*extra) -> list[dict]:
        assert main(["predict", "--model", str(tmp_path / "m"), str(tmp_path / "x.png"), "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)[0]["top"]

    cal, raw = top(), top("--uncalibrated")
    assert [t["class"] for t in cal] == [t["class"] for t in raw]  # the same classes in the same order
    want_cal, want_raw = probabilities(logits, 3.0), probabilities(logits)
    for got, want in ((cal, want_cal), (raw, want_raw)):
        assert [t["prob"] for t in got] == pytest.approx([float(want[t["index"]]) for t in got], abs=2e-6)
    assert cal[0]["prob"] < raw[0]["prob"]  # T = 3 > 1: less sure
    save(_model(), tmp_path / "plain")  # no temperature: both the same
    assert main(["predict", "--model", str(tmp_path / "plain"), str(tmp_path / "x.png"), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)[0]["top"]
    assert (
        main(["predict", "--model", str(tmp_path / "plain"), str(tmp_path / "x.png"), "--json", "--uncalibrated"]) == 0
    )
    assert a == json.loads(capsys.readouterr().out)[0]["top"]


@pytest.mark.parametrize("fmt", ["onnx", "torch"])
def test_the_temperature_travels_through_an_export(tmp_path, fmt):
    """The graph's output is the model's logits / T (softmax: calibrated, for any runtime); the folder records T;
    vitlab's runtime gives the model's own logits back and the same calibrated probabilities."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from vitlab.deploy import ExportOptions, export_folder, open_exported, read_export

    model = _model(2.0)
    rep = export_folder(model, tmp_path / "e", ExportOptions(format=fmt, timing_runs=0))
    assert read_export(tmp_path / "e")[1].temperature == 2.0
    assert rep["agreement"]["temperature"] == 2.0 and rep["agreement"]["max_abs_prob_diff"] < 1e-5
    x = torch.randn(5, 3, 8, 8)
    want = model(x)
    exported = open_exported(tmp_path / "e")
    assert_close_rel(exported(x), want)  # the model's own logits
    assert model_temperature(exported) == 2.0
    assert torch.allclose(probabilities(exported(x), 2.0), probabilities(want, 2.0), atol=1e-6)
    if fmt == "onnx":  # what another runtime reads: the calibrated logits
        import onnxruntime as ort

        sess = ort.InferenceSession(str(tmp_path / "e" / "model.onnx"), providers=["CPUExecutionProvider"])
        assert_close_rel(torch.from_numpy(sess.run(["logits"], {"pixel_values": x.numpy()})[0]), want / 2.0)
    cfg = tmp_path / "e" / "config.json"  # an edited record is data: a bad value is ignored with a warning
    raw = json.loads(cfg.read_text())
    raw["export"]["temperature"] = -1
    cfg.write_text(json.dumps(raw))
    with pytest.warns(UserWarning, match="export.temperature .* ignored"):
        assert read_export(tmp_path / "e")[1].temperature is None


def test_a_single_file_export_is_calibrated(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import onnxruntime as ort

    model = _model(4.0)
    save(model, tmp_path / "m")
    assert main(["export", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "m.onnx")]) == 0
    assert "divided by its temperature 4" in capsys.readouterr().out
    x = torch.randn(3, 3, 8, 8)
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert_close_rel(torch.from_numpy(sess.run(["logits"], {"pixel_values": x.numpy()})[0]), model(x) / 4.0)


# -- a run ------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("calibrated_run")
    data = tiny_folder(root / "data", per_class=16, test_per_class=7)
    out = root / "run"
    args = ["train", "--data", str(data), "--out", str(out), "--epochs", "2", "--cache-dir", str(root / "c"), *TRAIN]
    assert main(args) == 0
    return out


@pytest.mark.slow
def test_a_run_fits_its_temperature_on_images_it_does_not_report(run):
    summary = json.loads((run / "summary.json").read_text())
    cal = summary["calibration"]
    assert cal["fit_images"] + cal["ece_images"] == summary["eval"]["images"] == 21
    assert (cal["fit_images"], cal["ece_images"]) == (11, 10)
    assert "every other image" in cal["held_out"]
    for key in ("ece", "ece_uncalibrated", "temperature"):
        assert summary[key] == cal[key] and summary[key] is not None
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["extra"]["temperature"] == summary["temperature"]
    assert config["extra"]["ece"] == summary["ece"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["temperature"] == summary["temperature"]  # --keep last: the last epoch's weights
    assert model_temperature(vitlab.load(run)) == summary["temperature"]
    assert (run / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _, sections = training_artifacts(run / "model")  # the report
    assert any(s.title.startswith("Reliability diagram") and s.png for s in sections)
    table = next(s.table for s in sections if s.title == "Training summary")
    assert "ece" in table and "ece_uncalibrated" in table


@pytest.mark.slow
def test_eval_json_carries_both_eces_of_the_models_temperature(run, tmp_path, capsys):
    cache = str(run.parent / "c")
    assert (
        main(["eval", "--model", str(run), "--json", "--output", str(tmp_path / "e.json"), "--cache-dir", cache]) == 0
    )
    res = json.loads(capsys.readouterr().out)
    summary = json.loads((run / "summary.json").read_text())
    assert res["temperature"] == summary["temperature"]
    assert 0 <= res["ece"] <= 1 and 0 <= res["ece_uncalibrated"] <= 1
    assert sum(res["reliability"]["count"]) == res["count"] == 21
    assert json.loads((tmp_path / "e.json").read_text())["ece"] == res["ece"]
    assert main(["eval", "--model", str(run), "--output", str(tmp_path / "e.json"), "--cache-dir", cache]) == 0
    assert "calibration: ECE" in capsys.readouterr().out


@pytest.mark.slow
def test_the_benchmark_runs_on_generated_data(tmp_path, monkeypatch, capsys):
    """``benchmarks/bench_calibration.py --smoke``: a run, its held-out ECE and vitlab eval's on further images
    (their numbers are the lead's to measure on real data)."""
    from benchscripts import load

    bench = load("bench_calibration")
    monkeypatch.setattr("sys.argv", ["bench_calibration.py", "--smoke", "--work", str(tmp_path / "w")])
    bench.main()
    row = json.loads(next(line for line in capsys.readouterr().out.splitlines() if line.startswith("{")))
    assert row["further_images"] == 6 and row["held_out_images"] + row["fit_images"] == 6
    for key in ("temperature", "held_out_ece", "held_out_ece_uncalibrated", "further_ece", "further_ece_uncalibrated"):
        assert isinstance(row[key], float)


def test_a_model_saved_without_a_fit_never_keeps_an_inherited_temperature(tmp_path):
    """A fine-tuned model starts from its ``--init`` model's config, temperature included; ``model/`` must not keep a
    temperature fitted to other weights: the run's own, or ``null`` when it fitted none (masked patch prediction)."""
    from types import SimpleNamespace

    from vitlab.distributed import Dist
    from vitlab.train.persist.saver import CheckpointSaver

    saver = CheckpointSaver(tmp_path, dist=Dist(), device=torch.device("cpu"))
    cfg = SimpleNamespace(data="d", init="runs/x/model", objective="mpp", keep_adapters=False)
    recipe = SimpleNamespace(crop_pct=1.0, name="auto")
    saver.save_model(_model(7.0), cfg=cfg, recipe=recipe, ev={"top1": 0.5, "top5": 1.0}, epoch=1, calibration=None)
    assert json.loads((tmp_path / "model" / "config.json").read_text())["extra"]["temperature"] is None
    assert model_temperature(vitlab.load(tmp_path / "model")) == 1.0
    fitted = calibrate(torch.randn(40, 3), torch.arange(40) % 3)
    saver.save_model(_model(7.0), cfg=cfg, recipe=recipe, ev={"top1": 0.5, "top5": 1.0}, epoch=1, calibration=fitted)
    assert model_temperature(vitlab.load(tmp_path / "model")) == fitted.temperature != 7.0


def test_a_temperature_at_the_bound_of_images_all_right_is_not_kept():
    """Every fitting image right: the NLL falls without end as T shrinks and the fit stops at T_MIN, which would
    make predict 50 times as sure as the logits on any image, one of a class never seen too (before: kept, a 3-class
    run on 8 held-out images printed 97.5% for such a picture). T = 1 is kept and the run's line says why; one wrong
    fitting image gives the NLL a minimum again, and that temperature is kept when it pays."""
    from vitlab.commands.train import calibration_summary

    g = torch.Generator().manual_seed(0)
    y = torch.arange(40) % 4
    z = torch.randn(40, 4, generator=g) * 0.5
    z[torch.arange(40), y] += 3.0  # every image right, by a margin
    cal = calibrate(z, y)
    assert cal.fitted == T_MIN and cal.temperature == 1.0 and "every fitting image is right" in cal.why_not
    summary = {"calibration": {**cal.to_dict(), "ece_images": cal.ece_images, "fit_images": cal.fit_images}}
    assert f"temperature 1, not the fitted {T_MIN:g}: every fitting image is right" in calibration_summary(summary)
    z[2, 2], z[2, 1] = 0.0, 6.0  # image 2 (class 2, fitting half) wrong, confidently
    cal = calibrate(z, y)
    assert T_MIN < cal.fitted < 1.0 and cal.why_not in (None, "it did not pay out of sample")


def test_the_run_line_shows_a_kept_temperature_apart_from_the_fitted_one():
    """A fitted 0.9996 left for 1 read "temperature 1, not the fitted 1" (`vitlab train --pack --epochs 1`)."""
    from vitlab.commands.train import calibration_summary

    cal = {"temperature": 1.0, "fitted_temperature": 0.9996, "ece": 0.031, "ece_uncalibrated": 0.031}
    line = calibration_summary({"calibration": {**cal, "ece_images": 170, "fit_images": 171}})
    assert line is not None and "temperature 1, not the fitted 0.9996: it did not pay out of sample" in line
    cal = {**cal, "fitted_temperature": 0.777}
    line = calibration_summary({"calibration": {**cal, "ece_images": 170, "fit_images": 171}})
    assert "temperature 1, not the fitted 0.777:" in line

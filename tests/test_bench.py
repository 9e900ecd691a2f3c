"""`vitlab bench`: it runs, and its numbers are well-formed (never a wall-clock threshold)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import slow_cases
from vitlab import create_model
from vitlab.bench import (
    CallTimes,
    InProcess,
    Side,
    WorkerProcess,
    benchmark,
    build_reference,
    matmul_peak,
    median_interval,
    model_overrides,
    time_calls,
)
from vitlab.bench.paths import inference_path, training_path
from vitlab.cli import main
from vitlab.errors import ConfigError

TINY = dict(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, mlp_dim=64)


def _finite_positive(v: object) -> bool:
    return isinstance(v, float) and math.isfinite(v) and v > 0


@pytest.mark.slow
def test_benchmark_infer_fields() -> None:
    r = benchmark("vit_ti16", batch_size=2, num_classes=5, steps=2, warmup=1, peak_size=256, **TINY)
    d = r.to_dict()
    assert (d["model"], d["mode"], d["batch_size"], d["img_size"]) == ("vit_ti16", "infer", 2, 16)
    for k in ("images_per_sec", "gflops_per_sec", "peak_gflops_per_sec", "fraction_of_peak", "step_ms"):
        assert _finite_positive(d[k]), k
    assert d["ref"] is None and d["ratio"] is None
    assert len(d["step_times_ms"]) == 2
    # images/s and GFLOP/s are the same median seen two ways
    assert d["gflops_per_sec"] == pytest.approx(d["images_per_sec"] * d["gflops_per_image"], rel=1e-9)
    assert d["images_per_sec"] == pytest.approx(2 / (d["step_ms"] / 1e3), rel=1e-9)
    # 2 x MACs vitlab runs for the tiny model: 4 patches of 8x8x3 -> 32, a 5-way head, and one block,
    # which is also the last: keys and values of the 5 tokens, the rest for the class token alone
    t, n, dim = 5, 4, 32
    macs = n * 8 * 8 * 3 * dim + t * dim * 2 * dim + dim * dim + 2 * t * dim + dim * dim + 2 * dim * 64 + dim * 5
    assert d["gflops_per_image"] == pytest.approx(2 * macs / 1e9)
    assert d["params"] == sum(p.numel() for p in create_model("vit_ti16", num_classes=5, **TINY).parameters())


def test_benchmark_reports_the_inference_path() -> None:
    from vitlab.accel import onednn

    big = dict(
        img_size=224, patch_size=16, embed_dim=64, depth=1, num_heads=2, mlp_dim=40_000
    )  # 197 x 40k x 4 B = 31.5 MB / image
    r = benchmark("vit_ti16", batch_size=2, num_classes=5, steps=1, warmup=0, measure_peak=False, **big)
    fused = "oneDNN fused linears" if onednn.available() else "aten"
    assert r.inference_path == f"{fused}, 2 chunks of <= 1"
    assert f"({fused}" in r.summary()
    with onednn.disabled():
        r = benchmark("vit_ti16", batch_size=2, num_classes=5, steps=1, warmup=0, measure_peak=False, **TINY)
    assert r.inference_path == "aten"
    r = benchmark("vit_ti16", mode="train", batch_size=2, num_classes=5, steps=1, warmup=0, measure_peak=False, **TINY)
    assert r.inference_path is None


def test_benchmark_reports_the_training_path() -> None:
    from vitlab.accel import c_kernels as native
    from vitlab.accel import fused_block

    def path(**overrides) -> str | None:
        r = benchmark(
            "vit_ti16",
            mode="train",
            batch_size=2,
            num_classes=5,
            steps=1,
            warmup=0,
            measure_peak=False,
            **{**TINY, **overrides},
        )
        assert r.training_path is not None and f"({r.training_path})" in r.summary()
        return r.training_path

    kernels = "C kernels" if native.available() else "ATen kernels"
    assert path() == f"fused blocks, {kernels}"
    with native.disabled():
        assert path() == "fused blocks, ATen kernels"
    assert path(act="gelu_tanh") == "fused blocks, ATen kernels"  # the C kernels implement the exact GELU
    assert path(attn_drop_rate=0.1) == "autograd"  # dropout inside the block: the plain path
    with fused_block.disabled():
        assert path() == "autograd"
    r = benchmark("vit_ti16", batch_size=2, num_classes=5, steps=1, warmup=0, measure_peak=False, **TINY)
    assert r.training_path is None  # inference


@pytest.mark.slow
def test_benchmark_train_vs_timm() -> None:
    pytest.importorskip("timm")
    r = benchmark(
        "vit_ti16", mode="train", batch_size=2, num_classes=3, steps=2, warmup=0, vs="timm", measure_peak=False, **TINY
    )
    assert r.mode == "train" and r.ref == "timm"
    assert r.peak_gflops_per_sec is None and r.fraction_of_peak is None
    assert _finite_positive(r.ref_images_per_sec) and _finite_positive(r.ratio)
    assert r.ratio == pytest.approx(r.images_per_sec / r.ref_images_per_sec)
    lo, mid, hi = r.pair_ratios
    assert 0 < lo <= mid <= hi
    ci_lo, ci_hi = r.pair_ratio_interval
    assert lo <= ci_lo <= mid <= ci_hi <= hi
    assert "95% interval" in r.summary()
    assert sorted(t / o for o, t in zip(r.step_times_ms, r.ref_step_times_ms)) == pytest.approx([lo, hi])
    # a training step counts 3x the forward FLOPs
    assert r.gflops_per_sec == pytest.approx(3 * r.gflops_per_image * r.images_per_sec)
    assert len(r.ref_step_times_ms) == 2
    # ours trains with what `vitlab train` builds, the reference with plain AdamW; both are reported
    assert r.optimizer == "AdamW(fused)" and r.ref_optimizer == "AdamW(default)"


@pytest.mark.parametrize("kind", slow_cases(["timm", "hf"], {"hf"}))
def test_reference_is_the_same_architecture(kind: str) -> None:
    """The reference has exactly our parameter count, so the FLOPs we credit it with are right."""
    pytest.importorskip("timm" if kind == "timm" else "transformers")
    ours = create_model("vit_ti16", num_classes=7, **TINY)
    ref = build_reference(kind, ours.config)
    assert sum(p.numel() for p in ref.parameters()) == sum(p.numel() for p in ours.parameters())
    out = ref(torch.randn(2, 3, 16, 16))
    assert out.shape == (2, 7)


def test_aa_control_reference() -> None:
    ours = create_model("vit_ti16", num_classes=7, **TINY)
    twin = build_reference("vitlab", ours.config)
    assert type(twin) is type(ours) and twin.config == ours.config and twin is not ours


def test_timm_reference_gap_and_mlp_ratio() -> None:
    pytest.importorskip("timm")
    ours = create_model("vit_ti16", num_classes=4, pool="gap", class_token=False, fc_norm=True, **TINY)
    ref = build_reference("timm", ours.config)
    assert sum(p.numel() for p in ref.parameters()) == sum(p.numel() for p in ours.parameters())


def test_vs_timm_refuses_non_plain_models() -> None:
    with pytest.raises(ConfigError, match="only plain ViTs"):
        benchmark("vit_r_ti16", img_size=32, depth=1, batch_size=1, steps=1, warmup=0, vs="timm", measure_peak=False)


def test_model_overrides() -> None:
    assert model_overrides(img_size=32, patch_size=4, dim=192, depth=9, heads=3, mlp_ratio=2) == dict(
        img_size=32, patch_size=4, embed_dim=192, depth=9, num_heads=3, mlp_dim=384
    )
    assert model_overrides(mlp_ratio=2.0, base_dim=384) == {"mlp_dim": 768}
    with pytest.raises(ConfigError, match="mlp_ratio"):
        model_overrides(mlp_ratio=-1, dim=8)


def test_matmul_peak_is_positive() -> None:
    assert _finite_positive(matmul_peak(n=64, repeats=2))


def test_matmul_peak_is_the_faster_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """The peak takes oneDNN's packed GEMM into account (it ran ~15% above MKL's here): make
    that product take no time and the peak must become very large."""
    from vitlab.accel import onednn

    if not onednn.available():
        pytest.skip("no oneDNN in this torch build")
    monkeypatch.setattr(onednn, "packed_product", lambda x, packed, bias=None: None)
    assert matmul_peak(n=256, repeats=2) > 50 * matmul_peak(n=256, repeats=2, dtype=torch.float64)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(mode="predict"), "mode"),
        (dict(vs="keras"), "vs"),
        (dict(dtype="int8"), "dtype"),
        (dict(dtype="float16"), "float16"),
        (dict(batch_size=0), "batch_size"),
        (dict(compile="fast"), "compile"),
        (dict(threads=0), "threads"),
        (dict(ref_eager=True, vs="timm"), "ref_eager"),
        (dict(ref_eager=True, compile="default"), "ref_eager"),
    ],
)
def test_bad_options_raise_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        benchmark("vit_ti16", steps=1, warmup=0, measure_peak=False, **{**TINY, **kwargs})


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = "bench --model vit_ti16 --img-size 16 --patch-size 8 --dim 32 --depth 1 --heads 2 --mlp-ratio 2"
    argv += " --batch-size 2 --num-classes 3 --steps 2 --warmup 0 --peak-size 256 --json"
    assert main(argv.split()) == 0
    d = json.loads(capsys.readouterr().out)
    for k in (
        "model",
        "mode",
        "batch_size",
        "img_size",
        "images_per_sec",
        "gflops_per_sec",
        "peak_gflops_per_sec",
        "ref_images_per_sec",
        "ratio",
    ):
        assert k in d
    assert d["batch_size"] == 2 and d["img_size"] == 16 and d["mode"] == "infer"
    assert _finite_positive(d["images_per_sec"]) and _finite_positive(d["peak_gflops_per_sec"])
    assert d["fraction_of_peak"] > 0


def test_cli_text_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("timm")
    argv = "bench --model vit_ti16 --img-size 16 --patch-size 8 --dim 32 --depth 1 --heads 2 --batch-size 2"
    argv += " --steps 1 --warmup 0 --vs timm --no-peak"
    assert main(argv.split()) == 0
    out = capsys.readouterr().out
    assert "ratio vitlab / timm" in out and "img/s" in out
    assert main(["bench", "--model", "vit_ti16", "--img-size", "15", "--steps", "1", "--no-peak"]) == 2
    assert "error: --img-size: 15x15" in capsys.readouterr().err  # the flag, as the command spells it
    assert main(["bench", "--model", "vit_nope"]) == 2  # the one model rule's refusal, as every command's
    assert "'vit_nope': not a registered name" in capsys.readouterr().err


def test_cli_times_a_trained_models_architecture(finished_run, capsys: pytest.CaptureFixture[str]) -> None:
    """`--model` takes what every command takes (the one model rule): a run folder is timed as its architecture,
    with its own classes, at its own side; the architecture flags still override it. It was refused as "unknown
    model", a user could not time the model they had trained."""
    from vitlab import load

    trained = load(finished_run / "model").config
    base = ["bench", "--model", str(finished_run), "--batch-size", "2", "--steps", "1", "--warmup", "0", "--no-peak"]
    assert main([*base, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["img_size"], d["params"]) == (trained.img_size[0], trained.num_params())
    assert main([*base, "--num-classes", "7", "--depth", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    wider = trained.replace(num_classes=7, class_names=None, depth=2)
    assert d["params"] == wider.num_params() != trained.num_params()
    assert main(["bench", "--model", str(finished_run / "metrics.jsonl"), "--steps", "1", "--no-peak"]) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl" in err and "Traceback" not in err


@pytest.mark.slow
def test_isolated_workers_time_the_same_comparison() -> None:
    """--isolate: each model is built and timed in a worker process of its own; the result has
    the same shape as an in-process run, and says where it ran."""
    pytest.importorskip("timm")
    r = benchmark(
        "vit_ti16",
        mode="train",
        batch_size=2,
        num_classes=3,
        steps=2,
        warmup=1,
        vs="timm",
        measure_peak=False,
        isolate=True,
        **TINY,
    )
    assert r.isolate and r.ref == "timm" and len(r.step_times_ms) == len(r.ref_step_times_ms) == 2
    assert _finite_positive(r.ratio) and r.ratio == pytest.approx(r.images_per_sec / r.ref_images_per_sec)
    assert r.optimizer == "AdamW(fused)" and r.ref_optimizer == "AdamW(default)"
    assert r.params == sum(p.numel() for p in create_model("vit_ti16", num_classes=3, **TINY).parameters())
    assert "each model in its own process" in r.summary()


@pytest.mark.slow
def test_isolated_worker_errors_reach_the_caller() -> None:
    with pytest.raises(ConfigError, match="only plain ViTs"):
        benchmark(
            "vit_r_ti16",
            img_size=32,
            depth=1,
            batch_size=1,
            steps=1,
            warmup=0,
            vs="timm",
            measure_peak=False,
            isolate=True,
        )
    with pytest.raises(ConfigError, match="isolate"):
        benchmark("vit_ti16", steps=1, warmup=0, measure_peak=False, isolate=True, **TINY)


def test_page_faults_are_reported_per_side() -> None:
    pytest.importorskip("resource")
    r = benchmark("vit_ti16", batch_size=2, num_classes=3, steps=2, warmup=0, vs="vitlab", measure_peak=False, **TINY)
    assert r.faults_per_step is not None and r.faults_per_step >= 0
    assert r.ref_faults_per_step is not None and r.ref_faults_per_step >= 0
    assert "page faults per step" in r.summary()


def test_a_vs_a_training_run_trains_both_copies_alike() -> None:
    """--vs vitlab is an A/A control: the second copy gets vitlab's optimizer too, not timm users' AdamW."""
    r = benchmark(
        "vit_ti16",
        mode="train",
        batch_size=2,
        num_classes=3,
        steps=1,
        warmup=0,
        vs="vitlab",
        measure_peak=False,
        **TINY,
    )
    assert r.optimizer == r.ref_optimizer == "AdamW(fused)"


# -- the interval of the per-pair median ---------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=0.1, max_value=10.0), min_size=1, max_size=40))
def test_median_interval_brackets_the_median(values: list[float]) -> None:
    lo, hi = median_interval(values, resamples=400)
    med = sorted(values)[len(values) // 2] if len(values) % 2 else None
    assert min(values) <= lo <= hi <= max(values)
    if med is not None:  # odd length: the sample median is one of the values
        assert lo <= med <= hi
    assert median_interval(values, resamples=400) == (lo, hi)  # deterministic


def test_median_interval_narrows_with_more_steps_and_is_a_point_for_constant_ratios() -> None:
    assert median_interval([1.3] * 7) == (1.3, 1.3)
    g = torch.Generator().manual_seed(1)
    few = (1.3 + 0.2 * torch.randn(8, generator=g)).tolist()
    many = few + (1.3 + 0.2 * torch.randn(120, generator=g)).tolist()

    def width(values: list[float]) -> float:
        lo, hi = median_interval(values)
        return hi - lo

    assert width(many) < width(few) / 2
    with pytest.raises(ValueError, match="at least one"):
        median_interval([])


# -- the public pieces benchmarks build on --------------------------------------------------


@pytest.mark.slow
def test_a_worker_process_times_one_side() -> None:
    """``Side`` + ``WorkerProcess`` (what benchmarks/bench_native.py pairs): built in a process of
    its own, it reports the model it built and answers each step with (seconds, page faults)."""
    side = Side(key="ours", model="vit_ti16", overrides=TINY, mode="train", batch_size=2, num_classes=3, threads=1)
    with WorkerProcess(side) as worker:
        assert worker.built.step is None and worker.built.optimizer == "AdamW(fused)"
        assert worker.built.params == sum(
            p.numel() for p in create_model("vit_ti16", num_classes=3, **TINY).parameters()
        )
        dt, faults = worker.step()
        assert _finite_positive(dt) and (faults is None or faults >= 0)


def test_an_in_process_side_matches_the_benchmark_fields() -> None:
    built = InProcess(Side(key="ours", model="vit_ti16", overrides=TINY, batch_size=2, num_classes=5)).built
    r = benchmark("vit_ti16", batch_size=2, num_classes=5, steps=1, warmup=0, measure_peak=False, **TINY)
    assert (built.params, built.gflops_per_image, built.inference_path) == (
        r.params,
        r.gflops_per_image,
        r.inference_path,
    )
    built.step()


def test_the_path_labels_are_public() -> None:
    model = create_model("vit_ti16", num_classes=5, **TINY)
    assert inference_path(model, torch.randn(2, 3, 16, 16)).split(",")[0] in ("oneDNN fused linears", "aten")
    assert training_path(model.train()) in ("fused blocks, C kernels", "fused blocks, ATen kernels", "autograd")


def test_time_calls_takes_turns_and_alternates_the_order(monkeypatch) -> None:
    """Each round calls every callable once; the order reverses every other round, warm-up rounds counted (as
    ``benchmark`` alternates its sides), or stays with ``alternate=False``; only the timed rounds are kept."""
    import vitlab.bench.workers as workers

    clock = [0.0]
    monkeypatch.setattr(workers, "time", type("T", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    seen: list[str] = []

    def call(name: str, cost: float):
        def run() -> None:
            seen.append(name)
            clock[0] += cost

        return run

    calls = {"a": call("a", 1.0), "b": call("b", 2.0), "c": call("c", 4.0)}
    got = time_calls(calls, rounds=3, warmup=1)
    assert "".join(seen) == "abc" + "cba" + "abc" + "cba"
    assert list(got) == ["a", "b", "c"] and all(isinstance(t, CallTimes) for t in got.values())
    assert [got[k].seconds for k in "abc"] == [(1.0,) * 3, (2.0,) * 3, (4.0,) * 3]
    assert got["b"].median == 2.0 and len(got["c"].faults) == 3
    assert all(f is None or f >= 0 for f in got["a"].faults)
    seen.clear()
    time_calls(calls, rounds=2, alternate=False)
    assert "".join(seen) == "abcabc"


def test_time_calls_runs_setup_before_each_call_outside_its_timing(monkeypatch) -> None:
    import vitlab.bench.workers as workers

    clock = [0.0]
    monkeypatch.setattr(workers, "time", type("T", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    done: list[tuple[str, int]] = []

    def setup(name: str, r: int) -> None:
        done.append((name, r))
        clock[0] += 100.0  # (a setup's cost must not count)

    def tick() -> None:
        clock[0] += 0.5

    got = time_calls({"x": tick, "y": tick}, rounds=2, warmup=1, setup=setup)
    assert done == [("x", 0), ("y", 0), ("y", 1), ("x", 1), ("x", 2), ("y", 2)]
    assert got["x"].seconds == got["y"].seconds == (0.5, 0.5)


def test_time_calls_times_real_calls_and_refuses_nothing_to_time() -> None:
    model = create_model("vit_ti16", num_classes=3, **TINY).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.inference_mode():
        got = time_calls({"model": lambda: model(x)}, rounds=2, warmup=1)
    assert all(_finite_positive(t) for t in got["model"].seconds) and len(got["model"].seconds) == 2
    with pytest.raises(ConfigError, match="rounds must be positive"):
        time_calls({"model": lambda: None}, rounds=0)
    with pytest.raises(ConfigError, match="no callables"):
        time_calls({}, rounds=1)

"""Alarms and notes over attention-health series (vitlab.inspect.alarms): each fires on a series built to trigger it
and stays quiet on one just short of it; records read back from files never make them raise."""

from __future__ import annotations

import argparse
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitlab.inspect import AlarmThresholds, RunContext, attention_health, health_alarms, health_notes
from vitlab.inspect.alarms import PENDING_FLAGS, SUGGESTED_FLAGS
from vitlab.models import VisionTransformer
from vitlab.train.conf.parser import add_options


def rec(*, layers: int = 4, heads: int = 4, **over):
    """A healthy record (what :func:`attention_health` returns) with fields overridden."""
    r = {
        "layers": layers,
        "heads": heads,
        "tokens": 65,
        "grid": [8, 8],
        "pixels_per_patch": 4.0,
        "uniform_distance": 13.0,
        "distance": [6.0] * layers,
        "distance_per_head": [[3.0, 6.0, 9.0, 12.0][:heads] for _ in range(layers)],
        "max_entropy": 4.17,
        "entropy": [2.5] * layers,
        "entropy_per_head": [[2.5] * heads for _ in range(layers)],
        "collapse_threshold": 0.5,
        "collapsed_fraction": [0.0] * layers,
        "max_logit": [2.0] * layers,
        "token_norm_max": [12.0] * layers,
        "token_norm_median": [8.0] * layers,
        "outlier_ratio": [1.5] * layers,
    }
    r.update(over)
    return r


SMALL = RunContext(num_train_images=50_000, patch_size=4, lr=1e-3, epochs=10)


# -- entropy collapse ------------------------------------------------------------------------------------


def test_entropy_collapse_fires_on_half_a_layer_with_the_flags_that_help():
    hist = [rec(), rec(collapsed_fraction=[0.0, 0.0, 0.5, 1.0])]
    (msg,) = health_alarms(hist, context=SMALL)
    assert "entropy collapse in layers 3, 4" in msg and "50%, 100%" in msg
    assert "--qk-norm" in msg and "--lr (e.g. 0.0005)" in msg and "--warmup-epochs" in msg
    assert "Zhai" in msg
    # what the run already does is not suggested again
    done = RunContext(num_train_images=50_000, qk_norm=True, warmup=True)
    (msg,) = health_alarms(hist, context=done)
    assert "--qk-norm" not in msg and "warmup" not in msg and "a lower --lr" in msg


def test_entropy_collapse_quiet_below_half_the_heads():
    assert health_alarms([rec(collapsed_fraction=[0.25, 0.25, 0.0, 0.0])], context=SMALL) == []
    th = AlarmThresholds(collapsed_fraction=0.25)
    assert len(health_alarms([rec(collapsed_fraction=[0.25, 0.0, 0.0, 0.0])], context=SMALL, thresholds=th)) == 1


# -- logit growth --------------------------------------------------------------------------------------


def test_logit_growth_fires_past_the_floor_on_a_fresh_model():
    hist = [rec(max_logit=[2.0, 3.0, 3.0, 3.0]), rec(), rec(max_logit=[2.5, 150.0, 3.0, 2190.0])]
    (msg,) = health_alarms(hist, context=SMALL)
    assert "logit growth in layers 2, 4" in msg and "reached 2,190 (of order 1 at initialisation)" in msg
    assert "--qk-norm" in msg
    (msg,) = health_alarms(hist, context=RunContext(qk_norm=True, lr=2e-3))
    assert "--qk-norm" not in msg and "after qk-norm" in msg and "--lr (e.g. 0.001)" in msg
    # an epoch of a high LR can pass the floor before the first record: a fresh model's one record is enough
    (msg,) = health_alarms([rec(max_logit=[2017.0, 5.0, 5.0, 5.0])], context=SMALL)
    assert "logit growth in layer 1" in msg


def test_logit_growth_in_a_fine_tune_needs_the_factor_over_its_first_record():
    tuned = RunContext(num_train_images=3_000, lr=1e-3, fresh=False)
    (msg,) = health_alarms([rec(max_logit=[30.0] * 4), rec(max_logit=[30.0, 30.0, 30.0, 600.0])], context=tuned)
    assert "logit growth in layer 4" in msg and "rose from 30 to 600 (20x)" in msg
    assert health_alarms([rec(max_logit=[150.0] * 4)], context=tuned) == []  # one record: no growth yet
    assert health_alarms([rec(max_logit=[60.0] * 4), rec(max_logit=[300.0] * 4)], context=tuned) == []  # 5x


@pytest.mark.parametrize(
    ("first", "last"),
    [(2.0, 32.0), (2.0, 99.0), (30.0, 65.0)],
    ids=["a_default_runs_peak", "under_the_floor", "twice_the_default_lr"],
)
def test_logit_growth_quiet(first, last):
    hist = [rec(max_logit=[first] * 4), rec(max_logit=[last] * 4)]
    assert health_alarms(hist, context=SMALL) == []


# -- outlier tokens ------------------------------------------------------------------------------------


def test_outlier_tokens_that_appear_fire_with_registers_suggested():
    hist = [rec(), rec(outlier_ratio=[1.5, 1.5, 6.0, 9.5])]
    (msg,) = health_alarms(hist, context=SMALL)
    assert "outlier tokens in layers 3, 4" in msg and "9.5x the median" in msg and "--reg-tokens 4" in msg
    (msg,) = health_alarms(hist, context=RunContext(reg_tokens=4))
    assert "--reg-tokens" not in msg and "already has 4 register" in msg


def test_outlier_tokens_quiet_under_the_ratio_or_when_present_from_the_start():
    assert health_alarms([rec(), rec(outlier_ratio=[3.9] * 4)], context=SMALL) == []
    assert health_alarms([rec(outlier_ratio=[5.0] * 4), rec(outlier_ratio=[6.0] * 4)], context=SMALL) == []


# -- no local heads on small data: a note, not an alarm ------------------------------------------------


def _global(n: int, **kw):
    """``n`` records whose early-layer heads all attend near the uniform distance (13 px)."""
    kw = {"distance_per_head": [[11.0, 12.0, 12.5, 13.0]] + [[3.0, 13.0, 13.0, 13.0]] * 3, **kw}
    return [rec(**kw)] * n


def test_no_local_heads_is_noted_on_small_data_once_the_run_is_under_way_and_raises_no_alarm():
    """Every default run of docs/analyses.md shows it, and its remedies lost at the photo rows' budgets: the end of
    the run notes it with the remedies; the alarms (under the epoch line) stay for faults."""
    (msg,) = health_notes(_global(5), context=SMALL)
    assert "no local heads in layer 1 after 5 epochs on 50,000 images" in msg and "85%" in msg
    assert "--model vit_r_ti16" in msg and "--patch-size 2" in msg and "Raghu" in msg and "docs/analyses.md" in msg
    assert health_alarms(_global(5), context=SMALL) == []
    (msg,) = health_notes(_global(5), context=RunContext(num_train_images=1000, hybrid=True, patch_size=2))
    assert "hybrid" not in msg and "--patch-size 1" in msg


def test_no_local_heads_names_a_stem_at_the_runs_own_width_and_depth():
    """The registered hybrid (width 192, depth 12) is a much larger model than a short run's: the remedy keeps the
    run's Transformer and adds the stem, as the speedrun's hybrid track does."""
    ctx = RunContext(num_train_images=3_000, patch_size=8, embed_dim=128, depth=4, lr=1e-3, epochs=10)
    (msg,) = health_notes(_global(5), context=ctx)
    assert "--model vit_r_ti16 --patch-size 1 --dim 128 --depth 4" in msg and "--patch-size 4" in msg


@pytest.mark.parametrize(
    ("history", "context"),
    [
        (_global(4), SMALL),  # not yet half of the 10 planned epochs
        (_global(2), RunContext(num_train_images=50_000, patch_size=4)),  # under min_epochs
        (_global(5), RunContext(num_train_images=2_000_000, patch_size=4)),  # not small data
        (_global(5), RunContext(patch_size=4)),  # data size unknown
        (_global(5, grid=[3, 3]), SMALL),  # a grid too small for local vs global
        (_global(5, distance_per_head=[[10.0, 12.0, 13.0, 13.0]] * 4), SMALL),  # one head at 77%: local enough
        (_global(5), RunContext(num_train_images=1000, hybrid=True, patch_size=1)),  # nothing left to suggest
    ],
    ids=["early", "min_epochs", "big_data", "unknown_size", "tiny_grid", "one_local_head", "no_remedy"],
)
def test_no_local_heads_quiet(history, context):
    assert health_notes(history, context=context) == []


def test_early_layers_are_the_first_quarter():
    hist = [rec(layers=8, distance_per_head=[[12.0] * 4] * 2 + [[2.0] * 4] * 6)] * 5
    (msg,) = health_notes(hist, context=SMALL)
    assert "in layers 1, 2 after" in msg


# -- the series as data ----------------------------------------------------------------------------------


def test_a_healthy_series_and_an_empty_one_raise_nothing():
    for check in (health_alarms, health_notes):
        assert check([rec()] * 6, context=SMALL) == []
        assert check([], context=SMALL) == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12,
)
keys = st.sampled_from(list(rec()))


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.dictionaries(keys, json_values, max_size=6) | st.builds(rec) | json_values, max_size=4),
    st.builds(
        RunContext,
        num_train_images=st.none() | st.integers(0, 10**7),
        patch_size=st.none() | st.integers(1, 32),
        epochs=st.none() | st.integers(0, 50),
        lr=st.none() | st.floats(1e-6, 1.0),
    ),
)
def test_malformed_records_never_raise(history, context):
    out = health_alarms(history, context=context) + health_notes(history, context=context)
    assert isinstance(out, list) and all(isinstance(m, str) and "\n" not in m for m in out)


def test_every_flag_an_alarm_names_exists_or_is_pending():
    p = argparse.ArgumentParser()
    add_options(p, command="train")
    have = {s for a in p._actions for s in a.option_strings}
    assert {f for f in SUGGESTED_FLAGS if f not in have} == set(PENDING_FLAGS)
    bad = _global(1, collapsed_fraction=[1.0] * 4, max_logit=[500.0] * 4, outlier_ratio=[9.0] * 4)
    msgs = health_alarms(_global(4) + bad, context=SMALL) + health_notes(_global(4) + bad, context=SMALL)
    named = {f for m in msgs for f in re.findall(r"--[a-z][a-z-]+", m)}
    assert len(msgs) == 4 and named <= set(SUGGESTED_FLAGS)


def test_a_fresh_model_raises_no_alarm():
    torch.manual_seed(0)
    m = VisionTransformer(img_size=32, patch_size=4, embed_dim=32, depth=4, num_heads=4, mlp_dim=64, num_classes=10)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    h = attention_health(m, x)
    ctx = RunContext(num_train_images=2_000_000, patch_size=4)
    assert health_alarms([h, h, h], context=ctx) == [] and health_notes([h, h, h], context=ctx) == []

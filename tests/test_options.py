"""The option table (:mod:`vitlab.train.conf.options`) is the one description of every ``vitlab train`` /
``finetune`` option: each configuration field has a row (or is marked internal), the parser is generated from the
rows, and an error names an option by its flag."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from vitlab.errors import ConfigError
from vitlab.train.conf.options import INTERNAL, OPTIONS, OptionError, Ref, flag_for, option, path_of
from vitlab.train.conf.parser import add_options, namespace_values
from vitlab.train.conf.recipes import RECIPES, Recipe
from vitlab.train.conf.train_config import TrainConfig, build_config


def _fields() -> dict[str, dataclasses.Field]:
    top = {f.name: f for f in dataclasses.fields(TrainConfig)}
    return {**top, **{f"recipe.{f.name}": f for f in dataclasses.fields(Recipe)}}


def test_every_field_has_a_row_or_is_internal() -> None:
    paths = {o.path for o in OPTIONS if o.path is not None}
    missing = sorted(p for p in _fields() if p not in paths and p not in INTERNAL)
    assert missing == [], f"fields without a row in the option table (add a row, or mark them internal): {missing}"
    stray = sorted(p for p in paths if p not in _fields() and not p.startswith("arch."))
    assert stray == [], f"rows of no configuration field: {stray}"


def test_a_field_that_may_be_none_takes_a_config_files_null() -> None:
    for path, f in _fields().items():
        if path in INTERNAL or f.default is not None:
            continue
        assert option(path).from_file(None) is None, path


def test_the_parser_has_every_flag_row_and_nothing_else() -> None:
    for command in ("train", "finetune"):
        p = argparse.ArgumentParser()
        add_options(p, command=command)
        have = {s for a in p._actions for s in a.option_strings} - {"-h", "--help"}
        want = {f for o in OPTIONS if command in o.commands for f in (o.flag, *o.aliases) if f}
        assert have == want, command


def test_recipe_flags_leave_the_recipe_alone_unless_given() -> None:
    """A recipe's field defaults to None on the command line: the recipe's value stands."""
    for o in OPTIONS:
        if o.path and o.path.startswith("recipe.") and o.path != "recipe.name":
            assert o.default is None, o.path
    p = argparse.ArgumentParser()
    add_options(p, command="train")
    values, given = namespace_values(p.parse_args(["--lr", "0.01", "--clip-grad", "0"]), command="train")
    assert {k: v for k, v in values.items() if k.startswith("recipe.")} == {"recipe.lr": 0.01, "recipe.clip_grad": None}
    assert given == {"recipe.lr", "recipe.clip_grad"}
    cfg = build_config(values, given=given)
    assert cfg.recipe.name == "digits" and cfg.recipe.lr == 0.01 and cfg.recipe.clip_grad is None
    assert cfg.recipe.batch_size == RECIPES["digits"].batch_size and cfg.recipe_given == ["clip_grad", "lr"]


def test_a_warmup_given_in_epochs_or_steps_replaces_the_auto_recipes_fraction() -> None:
    """``--warmup-epochs 0`` (or ``--warmup-steps 0``) means no warmup: the auto recipe's 10% of the steps does not
    come back through ``warmup_fraction`` when the recipe is fitted; without the flag the fraction stays."""
    from vitlab.train.conf.phases import warmup_for
    from vitlab.train.sizing.recipe import classify_recipe

    p = argparse.ArgumentParser()
    add_options(p, command="train")

    def warmup(*flags: str) -> int:
        values, given = namespace_values(p.parse_args(["--data", "d", *flags]), command="train")
        recipe, _ = classify_recipe(build_config(values, given=given), n_train=50_000, image_size=(32, 32),
                                    num_classes=10, in_chans=3, device_type="cpu")  # fmt: skip
        assert recipe.name == "auto"
        return warmup_for(recipe, total_steps=1000, steps_per_epoch=100)[0]

    assert warmup() > 0  # the auto recipe's fraction of the steps
    assert warmup("--warmup-epochs", "0") == warmup("--warmup-steps", "0") == 0
    assert warmup("--warmup-steps", "7") == 7 and warmup("--warmup-epochs", "2") == 200


def test_the_recipe_choices_are_the_recipes() -> None:
    p = argparse.ArgumentParser()
    add_options(p, command="train")
    (action,) = [a for a in p._actions if "--recipe" in a.option_strings]
    assert list(action.choices) == list(RECIPES)


def test_an_error_names_each_option_by_its_flag_or_its_key() -> None:
    e = OptionError(Ref("fsdp"), " with ", Ref("recipe.ema"), ": not supported")
    assert str(e) == "--fsdp with --ema: not supported" and isinstance(e, ConfigError) and e.path == "fsdp"
    assert e.render(lambda p: p) == "fsdp with recipe.ema: not supported"
    assert flag_for("recipe.momentum") == "recipe.momentum"  # no flag: the config path
    assert path_of("--linear-probe") == "recipe.freeze" and path_of("--resume") is None
    with pytest.raises(ConfigError, match="--lr: must be positive"):
        build_config({"recipe.lr": 0.0})

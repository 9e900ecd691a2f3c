"""THE architecture rule: the run's model (a registered ``--model`` name, or the recipe's ``arch`` fields) with the
architecture options (``--patch-size``, ``--dim``, ``--depth``, ``--heads``, ``--mlp-ratio``, ``--pool``,
``--posemb``, ``--qk-norm``, ``--reg-tokens``) and the image size, as the :class:`~vitlab.models.config.ViTConfig`
of a fresh model. Validation (:func:`check`), the comparison of a resumed run (:func:`compared`), the memory
estimate and the model that is built (:func:`fresh_config`) all ask it, so they agree. A field the model
refuses is named by its option."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError
from ...models.config import ViTConfig, mlp_dim_for
from ...models.variants import model_config
from .options import OPTIONS, OptionError, Ref, ref

if TYPE_CHECKING:
    from .recipes import Recipe
    from .train_config import TrainConfig

__all__ = [
    "FIELD_PATHS",
    "SIZE_PATHS",
    "base_config",
    "check",
    "check_stem",
    "compared",
    "fresh_config",
    "head_choice",
    "smallest_config",
]

FIELD_PATHS: dict[str, str] = {
    "img_size": "img_size",
    "mlp_dim": "arch.mlp_ratio",
    "drop_path_rate": "recipe.drop_path",
    "drop_rate": "recipe.dropout",
    "patch_drop_rate": "recipe.token_drop",
    **{o.path.removeprefix("arch."): o.path for o in OPTIONS if o.path and o.path.startswith("arch.")},
}
"""A :class:`ViTConfig` field -> the option that sets it (for the error that names it)."""
_FIELDS = {f.name for f in dataclasses.fields(ViTConfig)}


@contextmanager
def _named() -> Iterator[None]:
    """A field the model refuses, named by its option (``num_heads: ...`` -> ``--heads: ...``)."""
    try:
        yield
    except OptionError:
        raise
    except ConfigError as e:
        if e.option not in FIELD_PATHS:
            raise
        raise OptionError(Ref(FIELD_PATHS[e.option]), f": {e.problem}") from None


def base_config(cfg: TrainConfig, recipe: Recipe | None = None) -> ViTConfig:
    """The model before the options: ``--model`` (else the recipe's ``model``), or the recipe's ``arch`` fields
    (``recipe``: the one the run trains with; None: the config's)."""
    r = recipe or cfg.recipe
    name = cfg.model or r.model
    if name:
        return model_config(name)
    unknown = sorted(set(r.arch) - _FIELDS)
    if unknown:
        raise OptionError(ref("recipe.arch"), f": {unknown[0]!r} is no model field (ViTConfig)")
    try:
        return ViTConfig(name="vit_custom", **r.arch)
    except OptionError:
        raise
    except ConfigError as e:  # the recipe's own fields (a config file's recipe.arch), not the flags over them
        raise OptionError(ref("recipe.arch"), f": {e}") from None


def _changes(cfg: TrainConfig, base: ViTConfig) -> dict[str, Any]:
    """The fields the architecture options change; ``--mlp-ratio`` (or a new width) gives ``mlp_dim``."""
    arch = dict(cfg.arch)
    ratio = arch.pop("mlp_ratio", None) or base.mlp_dim / base.embed_dim
    changes = {k: v for k, v in arch.items() if v is not None}
    if "embed_dim" in changes or cfg.arch.get("mlp_ratio"):
        with _named():
            changes["mlp_dim"] = mlp_dim_for(changes.get("embed_dim", base.embed_dim), ratio)
    return changes


def fresh_config(
    cfg: TrainConfig,
    *,
    recipe: Recipe | None = None,
    image_size: int | tuple[int, int],
    in_chans: int,
    num_classes: int,
    class_names: list[str],
    norm: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
) -> ViTConfig:
    """The configuration of the fresh model ``cfg`` trains (no ``--init``) with ``recipe`` (the one the run trains
    with, :class:`~vitlab.train.sizing.Sizing`'s; None: the config's): the size is ``--img-size``, else the
    recipe's, else the data's ``image_size``; the head, dropout rates and token dropping are the recipe's; ``norm``:
    the input ``(mean, std)`` (None: the model's own). A model the options change is named by its shape
    (``vit_p4_d128_l6``; a hybrid ``vit_r_p1_d128_l6``; with CCT's conv stem of two layers
    ``vit_cct_3x2_p1_d128_l6``). Nothing is allocated."""
    r = recipe or cfg.recipe
    base = base_config(cfg, r)
    changes = _changes(cfg, base)
    custom = bool(changes) or not (cfg.model or r.model)
    with _named():
        c = base.replace(
            **changes,
            img_size=cfg.img_size or r.img_size or image_size,
            in_chans=in_chans,
            num_classes=num_classes,
            head=r.head,
            drop_path_rate=r.drop_path,
            drop_rate=r.dropout,
            patch_drop_rate=0.0 if cfg.pack else r.token_drop,  # --pack: dropped per image before packing
            class_names=list(class_names),
            **({"mean": norm[0], "std": norm[1]} if norm else {}),
        )
    if cfg.distill_token and not c.dist_token:
        if c.pool != "cls" or c.head != "linear" or not c.class_token:
            raise OptionError(
                ref("distill_token"),
                ": DeiT's distillation token needs a class token, ",
                ref("arch.pool"),
                f" cls and a linear head (this model: pool {c.pool}, head {c.head}); add ",
                ref("arch.pool"),
                " cls",
            )
        c = c.replace(dist_token=True)
    if custom:
        stem = "" if c.hybrid_layers is None else "r" + "".join(str(n) for n in c.hybrid_layers) + "_"
        stem = f"cct_3x{c.stem_layers}_" if c.stem == "conv" else stem
        c = c.replace(name=f"vit_{stem}p{c.patch_size}_d{c.embed_dim}_l{c.depth}")
    return c


SIZE_PATHS = ("arch.depth", "arch.embed_dim", "arch.mlp_ratio", "arch.patch_size", "arch.reg_tokens", "img_size")
"""The options that make a model bigger, in the order a size refusal names them."""


def smallest_config(cfg: TrainConfig) -> ViTConfig:
    """The smallest model ``cfg`` can train, before the data is known: the image size the options or the recipe
    give, else four patches; one input channel, no head. Its parameters are a lower bound of the run's, which a
    size check compares before the data is read (:func:`vitlab.train.sizing.memory.check_model_size`)."""
    base = base_config(cfg)
    patch = (cfg.arch.get("patch_size") or base.patch_size) * base.stem_stride
    return fresh_config(cfg, image_size=4 * patch, in_chans=1, num_classes=0, class_names=[])


def check(cfg: TrainConfig) -> None:
    """Refuse an architecture no model can have, before the data's size is known (the size then is the options'
    or the recipe's, else four patches: the data's own is checked when the model is built)."""
    smallest_config(cfg)


def check_stem(cfg: TrainConfig) -> None:
    """The whitening initialisation and the masked-patch-prediction warm start of a fresh model need a first layer
    that is a plain patch projection: a ResNet stem standardises its weights (undoing the whitening), and masked
    patch prediction predicts pixel patches, which a convolutional stem does not see."""
    r = cfg.recipe
    if not (r.whiten_init or r.mpp_warmup):
        return
    base = base_config(cfg)
    if r.whiten_init and base.hybrid_layers is not None:
        raise OptionError(ref("recipe.whiten_init"), f": {base.name}'s ResNet stem standardises its weights, which "
                          "would undo the whitening; use a patch embedding or the conv stem (vit_cct*)")  # fmt: skip
    if r.mpp_warmup and (base.hybrid_layers is not None or base.stem != "patch"):
        raise OptionError(ref("recipe.mpp_warmup"), ": masked patch prediction predicts pixel patches, and "
                          f"{base.name}'s stem is convolutional; use a patch embedding")  # fmt: skip


def compared(cfg: TrainConfig) -> dict[str, Any]:
    """The architecture fields the options set, as the model is built (a flag equal to the recipe's value is no
    change): what a resumed run compares. An ``--init`` run's, or an unknown ``--model``'s, are the options'."""
    arch = {k: v for k, v in cfg.arch.items() if v is not None}
    try:
        base = base_config(cfg)
    except (ConfigError, KeyError, TypeError, ValueError):  # an unknown --model: compared by its name
        return arch
    ratio = arch.get("mlp_ratio") or base.mlp_dim / base.embed_dim
    fields = ("patch_size", "embed_dim", "depth", "num_heads", "pool", "posemb", "qk_norm", "reg_tokens")
    return {**{f: arch.get(f, getattr(base, f)) for f in fields}, "mlp_ratio": ratio}


def head_choice(init: ViTConfig, class_names: Sequence[str], *, new_head: bool = False) -> tuple[bool, str]:
    """``(whether the head is new, why)``: the pre-trained classifier is kept only when it predicts the data's classes,
    the same names in the same order (with ``new_head``, never); otherwise it is replaced by a zero-initialised one
    (the paper's Sec. 3.2). A head whose count matches but whose names differ would relabel the old classes."""
    names, old = list(class_names), list(init.class_names or [])
    if new_head:
        return True, "--new-head"
    if init.head != "linear":
        return True, "the pre-training MLP head dropped"
    if init.num_classes == 0:
        return True, "the model has no classifier head"
    if old == names:
        return False, f"the same {len(names)} classes in the same order"
    if not old:
        return True, f"the model names no classes, so its {init.num_classes} outputs cannot be matched to these"
    if sorted(old) == sorted(names):
        return True, "the same classes in another order"
    shown = ", ".join(old[:4]) + (" ..." if len(old) > 4 else "")
    return True, f"other classes: the model's are {shown}"

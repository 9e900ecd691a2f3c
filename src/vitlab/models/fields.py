"""Type checks for :class:`~vitlab.models.config.ViTConfig`'s fields as they are read: a config can come from an
untrusted ``config.json``, so every value is checked for its type and range, and a bad one is one
:class:`~vitlab.errors.ConfigError` naming the field (:func:`check_fields`)."""

from __future__ import annotations

import math
import numbers
from typing import Any

from ..errors import ConfigError

__all__ = ["check_fields", "describe_value"]

_MAX_INT = 1 << 31
"""No size, count or width of a ViT comes near this; bigger values (or JSON's 1e400) are refused,
so no later product of fields is astronomical."""
_INTS = ("patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_dim", "reg_tokens")
_INTS += ("stem_layers", "stem_width")
_BOOLS = ("qkv_bias", "class_token", "fc_norm", "dynamic_img_pad", "qk_norm", "dist_token", "pre_norm", "rope")
_BOOLS += ("key_bias", "attn_norm", "mlp_norm", "pool_include_prefix")
_STRS = ("name", "pool", "posemb", "posemb_resample", "head", "act", "attention", "stem", "mlp", "rope_kind")
_FLOATS = ("drop_rate", "attn_drop_rate", "drop_path_rate", "patch_drop_rate", "norm_eps", "rope_theta", "crop_pct")
_FLOATS += ("rope_offset",)
_OPTIONAL_INTS = ("representation_size", "map_heads", "map_mlp_dim")


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _int(option: str, v: Any, *, low: int = 1) -> int:
    """``v`` as an int in ``[low, 2**31)``, or a :class:`ConfigError` naming ``option``."""
    if not _is_int(v):
        raise ConfigError.at(option, f"expected an integer, got {describe_value(v)}")
    if not low <= int(v) < _MAX_INT:
        shown = int(v) if abs(int(v)).bit_length() <= 64 else f"a {abs(int(v)).bit_length()}-bit number"
        raise ConfigError.at(option, f"{shown} is out of range [{low}, {_MAX_INT})")
    return int(v)


def describe_value(v: Any) -> str:
    text = repr(v)
    return f"{type(v).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _ints(option: str, v: Any, *, length: int | None = None, low: int = 1) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)) or (length is not None and len(v) != length):
        shape = f"a list of {length} integers" if length else "a list of integers"
        raise ConfigError.at(option, f"expected {shape}, got {describe_value(v)}")
    return tuple(_int(f"{option}[{i}]", x, low=low) for i, x in enumerate(v))


def _floats(option: str, v: Any, length: int) -> tuple[float, ...]:
    if not isinstance(v, (list, tuple)) or len(v) != length:
        raise ConfigError.at(option, f"expected a list of {length} numbers, got {describe_value(v)}")
    return tuple(_float(f"{option}[{i}]", x) for i, x in enumerate(v))


def _float(option: str, v: Any) -> float:
    if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(float(v)):
        raise ConfigError.at(option, f"expected a finite number, got {describe_value(v)}")
    return float(v)


def _pair(x: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if _is_int(x):
        return (_int("img_size", x, low=0),) * 2
    if not isinstance(x, (list, tuple)) or len(x) != 2:
        raise ConfigError.at("img_size", f"expected an int or a (height, width) pair, got {describe_value(x)}")
    return _ints("img_size", x, length=2, low=0)  # type: ignore[return-value]  # positive: validate()


def check_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` (some or all of :class:`ViTConfig`'s) type-checked, within ``[0, 2**31)`` and normalised
    (tuples, ints, floats); other keys pass through. Raises :class:`ConfigError` naming the field.

    A config can come from an untrusted ``config.json``: a string, a nested list or a 1000-digit
    number where an int belongs must be one line naming the field, not a ``TypeError`` from deep
    inside the model. Ranges that depend on other fields are :meth:`ViTConfig.validate`'s."""
    out = dict(fields)
    for opt, v in fields.items():
        if opt == "img_size":
            out[opt] = _pair(v)
        elif opt in _INTS:
            out[opt] = _int(opt, v, low=0)
        elif opt in _BOOLS and not isinstance(v, bool):
            raise ConfigError.at(opt, f"expected true or false, got {describe_value(v)}")
        elif opt in _STRS and not isinstance(v, str):
            raise ConfigError.at(opt, f"expected a string, got {describe_value(v)}")
        elif opt in _FLOATS or (opt == "init_values" and v is not None):
            out[opt] = _float(opt, v)
        elif opt in _OPTIONAL_INTS and v is not None:
            out[opt] = _int(opt, v)
        elif opt == "rope_ref_grid" and v is not None:
            out[opt] = _ints(opt, v, length=2)
        elif opt == "hybrid_layers" and v is not None:
            out[opt] = _ints(opt, v, low=0)
        elif opt in ("mean", "std"):
            out[opt] = _floats(opt, v, 3)
        elif opt == "class_names" and v is not None:
            if not isinstance(v, (list, tuple)) or not all(isinstance(n, str) for n in v):
                raise ConfigError.at("class_names", f"expected a list of strings, got {describe_value(v)}")
            out[opt] = list(v)
        elif opt == "extra" and not isinstance(v, dict):
            raise ConfigError.at("extra", f"expected an object, got {describe_value(v)}")
    return out

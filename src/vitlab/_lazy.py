"""Names of a package imported when first used (PEP 562), so that importing the package imports none of the modules
that hold them: the packages whose modules need torch stay cheap to import where only a torch-free part is wanted
(``vitlab.train.conf``, the sizing rules, the decoder's header reads)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, where: Mapping[str, str], public: Sequence[str], *, keep: bool = True
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` of the package ``package``: a name of ``where`` (name -> module, relative to the
    package) is imported from its module at first use (``keep``: then set on the package, so that later lookups do
    not come back here); ``__dir__`` lists the ``public`` names."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{where[name]}", package), name)
        if keep:
            setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(public)

    return __getattr__, __dir__

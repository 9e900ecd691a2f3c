"""How a folder's images are stored in the decode cache for a run (:class:`FolderStorage`): the resolution it trains
at, the shorter side training images keep, and how the evaluation split is stored; decided from the files' headers
before anything is decoded (:func:`vitlab.train.sizing.side.folder_storage` makes it), recorded in a run's
``model/config.json`` and read back as data, every value checked."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..._text import size_px

__all__ = ["FolderStorage"]


@dataclass(frozen=True, kw_only=True)
class FolderStorage:
    """How a folder's images are stored in the decode cache for a run, decided from the files' headers before
    anything is decoded (:func:`vitlab.train.sizing.side.folder_storage` makes it).

    ``size``: the resolution the model trains at, ``(height, width)`` (``None``: the ``--init`` model's own).
    ``store_side``: training images keep their aspect ratio and whole extent, their shorter side shrunk to at
    most this (never enlarged), so that random crops can be drawn on the original picture; ``None``: their own
    size. ``eval_side``: evaluation images are stored ready for the evaluation (shorter side resized to it, then
    the square whose centre ``size`` crop is the whole image's: ``size / crop_pct``, timm's convention), so that
    evaluation only takes their centre; ``None``: stored as the training images are, and resized as they are
    evaluated. ``typical``: the images' typical shorter side; ``line``: what was chosen and why, for the run's
    first lines."""

    size: tuple[int, int] | None
    store_side: int | None
    eval_side: int | None = None
    crop_pct: float = 1.0
    typical: int = 0
    line: str = field(default="", compare=False)  # (what a run said of it: not what it is)

    def record(self) -> dict[str, Any]:
        """The storage as plain JSON values (a run's ``model/config.json`` keeps it), for :meth:`from_record`."""
        size = list(self.size) if self.size is not None else None
        return {"size": size, "store_side": self.store_side, "eval_side": self.eval_side, "crop_pct": self.crop_pct,
                "typical": self.typical}  # fmt: skip

    @classmethod
    def from_record(cls, rec: Any) -> FolderStorage | None:
        """The storage a :meth:`record` describes, or None when ``rec`` is not one (read from a file: every value is
        checked, nothing else is taken from it)."""

        def side(v: Any, *, none: bool = True) -> bool:
            return (v is None and none) or (type(v) is int and 1 <= v <= 1 << 16)

        if not isinstance(rec, dict) or set(rec) != {"size", "store_side", "eval_side", "crop_pct", "typical"}:
            return None
        size, crop = rec["size"], rec["crop_pct"]
        sized = size is None or (isinstance(size, list) and len(size) == 2 and all(side(v, none=False) for v in size))
        if not (sized and side(rec["store_side"]) and side(rec["eval_side"]) and side(rec["typical"], none=False)):
            return None
        if type(crop) not in (int, float) or not 0 < crop <= 1:
            return None
        storage = cls(size=tuple(size) if size else None, store_side=rec["store_side"], eval_side=rec["eval_side"],
                      crop_pct=float(crop), typical=rec["typical"])  # fmt: skip
        return replace(storage, line=storage.kept_line())

    def kept_line(self) -> str:
        """The first line of a run that keeps this storage, chosen before (a resumed run's, or a replay's with
        ``--config``): the side it trains at and how the images are stored; the reasons were the first run's."""
        to = f"training at {size_px(self.size)}" if self.size else "training at the --init model's size"
        kept = f"stored with the shorter side at most {self.store_side} px" if self.store_side else "stored as they are"
        return f"images: {to}; {kept}; crop_pct {self.crop_pct:g} (as chosen before, kept)"

"""Image files to pixels: the one decoder and the one channel rule of vitlab.

Training's decode cache, ``vitlab eval``, ``predict``, ``fewshot`` and ``inspect`` all read
files through :func:`decode_image`, and all adapt channels to a model with
:func:`match_channels`, so one image file gives one set of pixels whichever command reads it:
EXIF orientation applied, transparency composited on white, 16-bit scaled (not clipped) to
8 bits, decompression bombs refused from the header, RGB -> grey by the ITU-R 601-2 luma
(PIL's own ``convert("L")``), grey -> RGB by repetition. HEIC/HEIF photos decode where the ``heif`` extra
(``pillow-heif``) is installed (:func:`heif_readable`), the others where PIL reads them.
"""

from __future__ import annotations

import functools
import math
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, TypeVar

from .resize import centre_square, resized_shape

if TYPE_CHECKING:
    import numpy as np
    import torch
    from PIL import Image

__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "HEIF_EXTENSIONS",
    "HEIF_MISSING",
    "IMAGE_EXTENSIONS",
    "MAX_ASPECT",
    "UNREAD_EXTENSIONS",
    "OverBudget",
    "convert_mode",
    "counted_median",
    "decode_encoded",
    "decode_image",
    "decode_pil",
    "file_kind",
    "header_sizes",
    "heif_readable",
    "image_size",
    "is_image_name",
    "match_channels",
    "too_thin",
    "typical_side",
    "unread_format",
]

T = TypeVar("T", int, float)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif", ".avif")
"""File name endings (lower case) taken as images when a folder is searched (AVIF: read where Pillow was built with
it, ``PIL.features.check("avif")``, as the Pillow the project installs is; elsewhere such a file is reported as one
that cannot be used)."""
HEIF_EXTENSIONS = (".heic", ".heif")
"""Apple's HEIC/HEIF, an iPhone's default: images where the ``heif`` extra is installed (``pillow-heif``, which
gives PIL a HEIF decoder: :func:`heif_readable`), photos the decoder does not read where it is not."""
UNREAD_EXTENSIONS = (*HEIF_EXTENSIONS, ".jxl", ".dng", ".cr2", ".cr3", ".nef", ".arw", ".orf", ".rw2", ".raf", ".svg")
"""Endings of photos the decoder (PIL) does not read: HEIC/HEIF without the ``heif`` extra, JPEG XL, camera raw
files, SVG drawings. A folder search reports such a file as left out (:func:`unread_format`), never skips it without
a word as it skips a text file."""
HEIF_MISSING = (
    "a HEIC/HEIF image, which this install does not decode: pip install 'vitlab[heif]' (pillow-heif) and it does, "
    "or convert it to JPEG or PNG"
)
"""Why a HEIC/HEIF file is left out, or not decoded, where the ``heif`` extra is missing."""
_HEIF_BRANDS = (b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs", b"mif1", b"msf1")

DEFAULT_MAX_IMAGE_PIXELS = 89_478_485
"""PIL's own default decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``): about 1/4 GiB of RGB."""

MAX_ASPECT = 10
"""Longer side over shorter side above which an image of a training or evaluation folder is skipped:
such a strip is not a picture of its class, its centre square keeps a sliver of it, and resizing its
shorter side to the input size makes it enormous (a 1x700 strip resized to 224 is 224x156,800)."""

_EXIF_ORIENTATION = 0x0112
_TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height


def is_image_name(name: str) -> bool:
    """Whether a file name has one of :data:`IMAGE_EXTENSIONS` (any case), or of :data:`HEIF_EXTENSIONS` where
    they decode (:func:`heif_readable`), and is not hidden (``.name``)."""
    low = name.lower()
    return not name.startswith(".") and (
        low.endswith(IMAGE_EXTENSIONS) or (low.endswith(HEIF_EXTENSIONS) and heif_readable())
    )


def unread_format(name: str) -> str | None:
    """Why a file named ``name`` is left out when it is a photo of a format the decoder does not read
    (:data:`UNREAD_EXTENSIONS`, any case, not hidden; HEIC/HEIF only without the ``heif`` extra), else None."""
    low = name.lower()
    if name.startswith(".") or not low.endswith(UNREAD_EXTENSIONS):
        return None
    if low.endswith(HEIF_EXTENSIONS):
        return None if heif_readable() else HEIF_MISSING
    ext = low.rpartition(".")[2]
    return f"a .{ext} image: a format vitlab's decoder (PIL) does not read; convert it to JPEG or PNG"


@functools.cache
def heif_readable() -> bool:
    """Whether HEIC/HEIF files decode here: ``pillow_heif`` is importable, and its PIL opener is then registered
    (once a process; a worker process registers it again at its first HEIF). It applies the file's rotation (HEIF's
    ``irot``/``imir``) as it decodes and sets the EXIF orientation to 1, so :func:`decode_pil`'s EXIF rule turns
    nothing twice and :func:`image_size` reads the turned size from the header
    (``tests/test_heif.py::test_a_heic_photo_decodes_as_its_jpeg_does``)."""
    import importlib.util

    if importlib.util.find_spec("pillow_heif") is None:
        return False
    try:
        import pillow_heif

        pillow_heif.register_heif_opener()
    except Exception:  # a broken install: as if it were not there
        return False
    return True


def _looks_heif(src: str | os.PathLike[str] | bytes | IO[bytes]) -> bool:
    """Whether ``src`` starts as a HEIF file does (an ISO media ``ftyp`` box of a HEIF brand): its first 12 bytes
    (a file object's from its start, where :func:`decode_encoded`'s image starts, whatever PIL's failed open read)."""
    try:
        if hasattr(src, "read"):
            src.seek(0)  # type: ignore[union-attr]
            head = src.read(12)  # type: ignore[union-attr]
        else:
            with open(src, "rb") as f:  # type: ignore[arg-type]
                head = f.read(12)
    except (OSError, ValueError):
        return False
    return head[4:8] == b"ftyp" and head[8:12] in _HEIF_BRANDS


def _open(src: str | os.PathLike[str] | bytes | IO[bytes]) -> Image.Image:
    """``PIL.Image.open(src)``, and for a HEIF file PIL does not know yet, its opener registered first
    (:func:`heif_readable`) or a ``ValueError`` naming the extra that reads it: nothing is imported for the other
    formats."""
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(src)
    except UnidentifiedImageError:
        if not _looks_heif(src):
            raise
        if not heif_readable():
            raise ValueError(HEIF_MISSING) from None
        if hasattr(src, "seek"):
            src.seek(0)  # type: ignore[union-attr]
        return Image.open(src)


def too_thin(width: int, height: int) -> bool:
    """Whether a ``width`` x ``height`` image is longer than :data:`MAX_ASPECT` times its width (or the reverse)."""
    return max(width, height) > MAX_ASPECT * max(1, min(width, height))


class OverBudget(ValueError):
    """An image whose pixels after the resize would take more than the decode cache's ``max_bytes``."""


def typical_side(sizes: Mapping[tuple[int, int], int]) -> int:
    """The typical shorter side of a folder of images: the median shorter side over the images (``sizes``
    maps ``(width, height)`` to a count), leaving out strips (:func:`too_thin`), so that a few outliers,
    thin or huge, never set the model's input size (nor the size a folder of mixed sizes is decoded to)."""
    return counted_median(sizes, min)


def counted_median(sizes: Mapping[tuple[int, int], int], of: Callable[[tuple[int, int]], T]) -> T:
    """The (lower) median of ``of((width, height))`` over the images ``sizes`` counts (``(width, height) -> count``),
    leaving out strips (:func:`too_thin`) unless nothing else is there: :func:`typical_side`'s rule, for any
    measure of an image's size (its shorter side, its aspect ratio), in time of the distinct sizes, not the images."""
    values = sorted((of(wh), n) for wh, n in sizes.items() if not too_thin(*wh)) or sorted(
        (of(wh), n) for wh, n in sizes.items()
    )
    half, seen = (sum(n for _, n in values) + 1) // 2, 0
    for value, n in values:
        seen += n
        if seen >= half:
            return value
    raise ValueError("the median of no images")


def header_sizes(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[int, int] | None]:
    """:func:`image_size` of each of ``paths`` (``None`` where the header cannot be read): headers only,
    no pixels decoded, so a folder's sizes are known before anything is decoded."""
    return [image_size(p) for p in paths]


def _orientation(im: Image.Image, *, header_only: bool = False) -> int:
    """The EXIF orientation tag (1: as stored). ``header_only``: never decode pixels to find it
    (PIL loads a PNG whose ``eXIf`` chunk follows the pixel data; such a file then counts as 1)."""
    if header_only and im.format == "PNG" and "exif" not in im.info:
        return 1
    try:
        return int(im.getexif().get(_EXIF_ORIENTATION, 1))
    except Exception:  # a corrupt EXIF block: decode the pixels as stored
        return 1


def image_size(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(width, height)`` of the decoded image (EXIF orientation applied) from the file's header,
    without decoding the pixels; ``None`` for a file PIL cannot open."""
    try:
        with _open(path) as im:
            w, h = im.size
            return (h, w) if _orientation(im, header_only=True) in _TRANSPOSED else (w, h)
    except Exception:
        return None


def _to_8bit(im: Image.Image) -> Image.Image:
    """16-bit and 32-bit integer / float greyscale (PNG ``I;16``, TIFF ``I``/``F``) to ``L`` by
    scaling, not clipping: PIL's own conversion saturates every value above 255 to white."""
    import numpy as np
    from PIL import Image

    a = np.asarray(im).astype(np.float64)
    if im.mode == "F":
        top = 1.0 if a.size and a.max() <= 1.0 else 255.0
    else:
        top = 65535.0 if im.mode.startswith("I;16") or (a.size and a.max() > 255) else 255.0
    return Image.fromarray(np.clip(np.round(a * (255.0 / top)), 0, 255).astype(np.uint8), "L")


def convert_mode(im: Image.Image, mode: str = "RGB") -> Image.Image:
    """A PIL image in ``mode`` (``RGB`` or ``L``) by the decoder's rule: 16-bit and float greyscale scaled to
    8 bits (:func:`_to_8bit`), palette and alpha composited on white, anything else through ``convert("RGB")``,
    and ``L`` the luma of that RGB image (grey -> RGB -> grey is the identity). An ``RGB`` image is returned as
    it is. :func:`vitlab.transforms_for` converts a PIL image so before resizing it."""
    from PIL import Image

    if mode not in ("RGB", "L"):
        raise ValueError(f"mode {mode!r}: expected 'RGB' or 'L'")
    if im.mode in ("I", "F") or im.mode.startswith("I;16"):
        im = _to_8bit(im)
    if im.mode in ("P", "LA", "RGBA", "PA"):
        im = im.convert("RGBA")
        bg = Image.new("RGBA", im.size, (255, 255, 255, 255))  # composite transparency on white
        im = Image.alpha_composite(bg, im)
    if im.mode != "RGB":
        im = im.convert("RGB")
    if mode == "L":
        im = im.convert("L")  # ITU-R 601-2 luma, rounded: what match_channels computes
    return im


def decode_pil(im: Image.Image, mode: str = "RGB") -> Image.Image:
    """An opened PIL image as the decoder turns a file into pixels (after its size checks): turned as its EXIF
    orientation tag says, then :func:`convert_mode` (transparency on white, 16-bit scaled, ``mode``). What
    :func:`decode_image` does to every file, and :func:`vitlab.transforms_for` to a PIL image it is given."""
    return convert_mode(_oriented(im), mode)


def _oriented(im: Image.Image) -> Image.Image:
    """``im`` turned as its EXIF orientation tag says (phones store portraits sideways)."""
    from PIL import ImageOps

    if _orientation(im) == 1:
        return im  # no copy for the common case
    return ImageOps.exif_transpose(im)


def decode_image(
    path: str | os.PathLike[str] | bytes,
    *,
    mode: str = "RGB",
    size: int | None = None,
    max_pixels: int | None = None,
    max_aspect: float | None = None,
    max_bytes: int | None = None,
    shorter_side: int | None = None,
    crop: int | None = None,
) -> np.ndarray:
    """One image file as a ``(H, W, C)`` uint8 array in PIL ``mode`` (``RGB`` or ``L``).

    The EXIF orientation is applied; palette and alpha images are composited on white;
    CMYK/YCbCr/greyscale are converted; 16-bit is scaled to 8 bits. ``L`` is the luma of the
    RGB image (the rule of :func:`match_channels`, also for JPEGs, which are never decoded as
    grey by libjpeg). ``size``: the evaluation's storage, the shorter side resized to ``size`` as
    :func:`vitlab.data.eval_transform` and timm's evaluation transform resize it (PIL bicubic, the longer
    side by :func:`~vitlab.data.images.resize.resized_shape`, the file decoded at full scale, as PIL opens it for
    them), then the square of :func:`~vitlab.data.images.resize.centre_square` for a later centre crop of ``crop``
    (default ``size``), so that the evaluation's pixels are those of timm's transform of the file.
    ``shorter_side`` (without ``size``) shrinks an image whose shorter side is longer to that side, keeping
    its aspect ratio and its whole extent (no crop), so that random crops later still see the whole picture
    (a JPEG decoded at a reduced DCT scale where one fits).

    Raises ``ValueError`` with the reason for an empty file, a path that is not a regular file
    (a FIFO or a device is never opened: reading one would block or never end), an image over
    ``max_pixels`` (default :data:`DEFAULT_MAX_IMAGE_PIXELS`: a decompression bomb is refused from its
    header, before decoding), one longer than ``max_aspect`` times its width (or the reverse; see
    :data:`MAX_ASPECT`), or one whose pixels after the resize would take more than ``max_bytes``
    (a decode cache's memory budget); PIL's errors for truncated or non-image files pass through.
    ``path`` may be bytes or a str holding undecodable bytes as surrogates (``os.fsdecode``).
    Encoded bytes in memory (a tar shard's member) go through :func:`decode_encoded`."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"not a regular file ({file_kind(st.st_mode)}); not opened")
    if st.st_size == 0:
        raise ValueError("empty file (0 bytes)")
    return _decode(
        path,
        mode=mode,
        size=size,
        max_pixels=max_pixels,
        max_aspect=max_aspect,
        max_bytes=max_bytes,
        shorter_side=shorter_side,
        crop=crop,
    )


def decode_encoded(
    data: bytes,
    *,
    mode: str = "RGB",
    max_pixels: int | None = None,
    at_least: tuple[int, int] | None = None,
    region: Callable[[int, int], tuple[int, int, int, int]] | None = None,
    jpeg_turbo: bool = False,
    shorter_side: int | None = None,
) -> np.ndarray:
    """An encoded image held in memory (a member of a tar shard) as :func:`decode_image` decodes a file,
    at full resolution, or smaller only where nothing is lost for the caller:

    ``shorter_side``: as :func:`decode_image`'s (the decode cache's storage of a training image: the shorter side
    shrunk to it, aspect ratio and whole extent kept), the same pixels as a folder's file gets.

    ``at_least`` ``(width, height)``: a JPEG may be decoded at a reduced DCT scale (1/2, 1/4, 1/8; PIL's
    draft mode) that keeps the image at least that large (evaluation resizes it to that size anyway).
    ``region(width, height) -> (left, top, right, bottom)``: called with the full image's size (EXIF
    orientation applied), the box to return; a JPEG is decoded at the smallest scale that keeps the box at
    least ``at_least`` (RandomResizedCrop: the box is drawn on the original image and resized to the input
    size afterwards, so the resize never sees fewer pixels than it outputs).

    ``jpeg_turbo``: an RGB or grey JPEG without EXIF rotation that draft mode would not shrink is decoded by
    ``torchvision.io.decode_jpeg`` instead (libjpeg-turbo; faster than PIL's decoder on the same file, its pixels
    may differ from PIL's by a level or two: for training's random crops, not for evaluation)."""
    import io

    if not data:
        raise ValueError("empty file (0 bytes)")
    src = io.BytesIO(data)
    return _decode(src, mode=mode, max_pixels=max_pixels, at_least=at_least, region=region, turbo=jpeg_turbo,
                   shorter_side=shorter_side)  # fmt: skip


def _decode(
    src: str | os.PathLike[str] | bytes | IO[bytes],
    *,
    mode: str,
    size: int | None = None,
    max_pixels: int | None = None,
    max_aspect: float | None = None,
    max_bytes: int | None = None,
    shorter_side: int | None = None,
    crop: int | None = None,
    at_least: tuple[int, int] | None = None,
    region: Callable[[int, int], tuple[int, int, int, int]] | None = None,
    turbo: bool = False,
) -> np.ndarray:
    """The decoding shared by :func:`decode_image` and :func:`decode_encoded` (``src``: a path or a file object)."""
    import numpy as np
    from PIL import Image

    if mode not in ("RGB", "L"):
        raise ValueError(f"mode {mode!r}: expected 'RGB' or 'L'")
    if crop is not None and (size is None or not 0 < crop <= size):
        raise ValueError(f"crop {crop}: expected a side in 1..size ({size})")
    limit = max_pixels or DEFAULT_MAX_IMAGE_PIXELS
    if Image.MAX_IMAGE_PIXELS is not None and limit > Image.MAX_IMAGE_PIXELS:
        # PIL refuses 2x its own limit in open(): let a larger --max-image-pixels through
        Image.MAX_IMAGE_PIXELS = limit
    try:
        im = _open(src)
    except Image.DecompressionBombError as e:
        raise ValueError(f"{e} (decompression-bomb guard; raise --max-image-pixels if you trust the file)") from None
    with im:
        w, h = im.size
        if w * h > limit:
            raise ValueError(
                f"{w}x{h} = {w * h:,} pixels exceeds the limit of {limit:,} "
                "(decompression-bomb guard, --max-image-pixels)"
            )
        if max_aspect is not None and max(w, h) > max_aspect * max(1, min(w, h)):
            raise ValueError(f"{w}x{h}: one side is over {max_aspect:g} times the other (a strip, not a picture)")
        if size is None and shorter_side is not None and min(w, h) > shorter_side:
            ow, oh = resized_shape(w, h, shorter_side)
        else:
            ow, oh = resized_shape(w, h, size) if size is not None else (w, h)
        nbytes = ow * oh * (3 if mode == "RGB" else 1)
        if max_bytes is not None and nbytes > max_bytes:
            raise OverBudget(
                f"{w}x{h} would take {nbytes:,} bytes as {ow}x{oh} {mode}, over the limit of {max_bytes:,} "
                "(half the memory budget, --memory-budget)"
            )
        box = None
        if region is not None or at_least is not None:  # sizes in the oriented picture's coordinates
            turned = _orientation(im, header_only=True) in _TRANSPOSED
            fw, fh = (h, w) if turned else (w, h)
            box = region(fw, fh) if region is not None else (0, 0, fw, fh)
            need_w, need_h = at_least or (box[2] - box[0], box[3] - box[1])
            scale = min(1.0, max(need_w / max(1, box[2] - box[0]), need_h / max(1, box[3] - box[1])))
            ow, oh = math.ceil(w * scale), math.ceil(h * scale)  # the draft request: the file's own axes
            plain_jpeg = im.format == "JPEG" and im.mode in ("RGB", "L") and mode == "RGB"
            if turbo and plain_jpeg and scale > 0.5 and _orientation(im, header_only=True) == 1:
                fast = _turbo(src, box)  # no DCT scale applies, no rotation: libjpeg-turbo through torchvision
                if fast is not None:
                    return fast
        if size is None:  # JPEG: decode at a reduced DCT scale when possible (never below the size asked for)
            im.draft("RGB", (ow, oh))
        im = decode_pil(im, mode)
        if box is not None:
            sx, sy = im.size[0] / fw, im.size[1] / fh  # the draft scale (1 when none applied)
            x0, y0 = min(im.size[0] - 1, int(box[0] * sx)), min(im.size[1] - 1, int(box[1] * sy))
            im = im.crop((x0, y0, max(x0 + 1, round(box[2] * sx)), max(y0 + 1, round(box[3] * sy))))
        elif size is not None and im.size != (size, size):
            # the evaluation's resize (shorter side to `size`, bicubic), then the square whose centre it crops
            shape = resized_shape(*im.size, size)
            if shape != im.size:
                im = im.resize(shape, Image.Resampling.BICUBIC)
            im = im.crop(centre_square(*im.size, size, crop))
        elif size is None and shorter_side is not None and min(w, h) > shorter_side:
            # the shape from the file's own size (draft mode may have rounded it), turned as EXIF turned it
            turned = (im.size[0] >= im.size[1]) != (w >= h)
            im = im.resize((oh, ow) if turned else (ow, oh), Image.Resampling.BICUBIC)
        arr = np.asarray(im, dtype=np.uint8)
    return arr[..., None] if arr.ndim == 2 else arr


def _turbo(src: IO[bytes], box: tuple[int, int, int, int]) -> np.ndarray | None:
    """The ``box`` of a JPEG decoded by ``torchvision.io.decode_jpeg`` as RGB, ``(H, W, 3)`` (a view); None
    where torchvision no longer has it (0.29 deprecates its decoders for TorchCodec's): PIL decodes then."""
    import io

    import torch

    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        return None

    data = src.getvalue() if isinstance(src, io.BytesIO) else (src.seek(0), src.read())[1]
    x = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    return x[:, box[1] : box[3], box[0] : box[2]].permute(1, 2, 0).numpy()


def file_kind(mode: int) -> str:
    """What a stat ``st_mode`` that is not a regular file is, in words (for messages)."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def match_channels(x: torch.Tensor, in_chans: int) -> torch.Tensor:
    """``(..., C, H, W)`` uint8 -> ``in_chans`` channels: grey -> RGB (or any count) by repetition,
    RGB -> grey by the ITU-R 601-2 luma ``0.299 R + 0.587 G + 0.114 B`` rounded to the nearest
    level, in PIL's fixed point, so it equals ``decode_image(mode="L")`` and grey -> RGB -> grey
    is the identity. Raises :class:`~vitlab.errors.InputError` for any other pair of counts."""
    import torch

    from ...errors import InputError

    c = x.shape[-3]
    if c == in_chans:
        return x
    if c == 1:
        return x.expand(*x.shape[:-3], in_chans, *x.shape[-2:])
    if in_chans == 1 and c == 3:
        r, g, b = x.to(torch.int32).unbind(-3)
        return ((r * 19595 + g * 38470 + b * 7471 + 32768) >> 16).to(x.dtype).unsqueeze(-3)
    raise InputError(f"images with {c} channels cannot feed a model with in_chans={in_chans}")

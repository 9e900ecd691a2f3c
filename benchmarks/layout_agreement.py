"""A vitlab model in timm's and Hugging Face's layouts, scored as their users score it (docs/backbones.md, "Which
layouts convert to which"): ``vitlab convert MODEL DIR --layout timm`` and ``--layout hf``, then each test photo of
``--data`` (a folder of class folders) classified three ways,

- vitlab: ``vitlab.transforms_for(model)`` of the file and the model (what ``vitlab predict`` feeds it);
- timm: ``timm.create_model("local-dir:DIR")`` and ``timm.data.create_transform`` of its ``pretrained_cfg``;
- Hugging Face: ``ViTForImageClassification.from_pretrained(DIR)`` and ``AutoImageProcessor.from_pretrained(DIR)``
  (the processor ``pipeline("image-classification")`` uses),

the last two on the photo as PIL opens it, turned by its EXIF orientation. Prints each library's top-1 accuracy and
its top-1 agreement with vitlab. Needs timm and transformers (the test extras).

    python benchmarks/layout_agreement.py --model runs/clothing/model --data ../shared/data/clothing/test
    python benchmarks/layout_agreement.py --smoke      # a tiny random model on 6 generated photos: that it runs
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import photo_pixels

import vitlab

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def convert(model: Path, out: Path, layout: str) -> None:
    """``vitlab convert MODEL OUT --layout LAYOUT``, as a user runs it."""
    cmd = [sys.executable, "-m", "vitlab", "convert", str(model), str(out), "--layout", layout]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def photos_of(data: Path) -> list[tuple[Path, str]]:
    """``(file, class folder name)`` of every image under ``data``'s class folders, sorted."""
    return [(f, f.parent.name) for f in sorted(data.glob("*/*")) if f.suffix.lower() in IMAGE_SUFFIXES]


def smoke_data(root: Path) -> tuple[Path, Path]:
    """A tiny random sine-cosine model (the auto recipe's positions) saved as vitlab saves it, and 6 generated photos
    of two classes, portrait and landscape."""
    from PIL import Image

    torch.manual_seed(0)
    model = vitlab.create_model(
        "vit_ti16", img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, mlp_dim=64, num_classes=2,
        posemb="sincos2d", crop_pct=0.875, class_names=["a", "b"],
    )  # fmt: skip
    vitlab.save(model, root / "model")
    rng = np.random.default_rng(0)
    for i in range(6):
        folder = root / "data" / "ab"[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo_pixels(rng, (90, 60) if i % 3 else (60, 90))).save(folder / f"{i}.png")
    return root / "model", root / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a vitlab model folder (a run's model/)")
    ap.add_argument("--data", type=Path, help="a folder of class folders of test photos")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    import timm
    import transformers
    from PIL import Image, ImageOps

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir, data = smoke_data(work) if args.smoke else (args.model, args.data)
        if model_dir is None or data is None:
            ap.error("--model and --data (or --smoke)")
        for layout in ("timm", "hf"):
            convert(model_dir, work / layout, layout)
        ours = vitlab.load(model_dir).eval()
        ours_tf = vitlab.transforms_for(ours)
        tm = timm.create_model(f"local-dir:{work / 'timm'}", pretrained=True).eval()
        tm_tf = timm.data.create_transform(**timm.data.resolve_data_config({}, model=tm))
        hf = transformers.ViTForImageClassification.from_pretrained(work / "hf").eval()
        proc = transformers.AutoImageProcessor.from_pretrained(work / "hf")
        names = list(ours.config.class_names)
        photos = photos_of(data)
        right = {"vitlab": 0, "timm": 0, "hf": 0}
        agree = {"timm": 0, "hf": 0}
        with torch.no_grad():
            for path, label in photos:
                with Image.open(path) as im:
                    image = ImageOps.exif_transpose(im).convert("RGB")
                top = {
                    "vitlab": int(ours(ours_tf(path)[None]).argmax()),
                    "timm": int(tm(tm_tf(image)[None]).argmax()),
                    "hf": int(hf(**proc(image, return_tensors="pt")).logits.argmax()),
                }
                for k, v in top.items():
                    right[k] += names[v] == label
                for k in agree:
                    agree[k] += top[k] == top["vitlab"]
    n = len(photos)
    print(f"{n} photos of {data}; processor {type(proc).__name__}")
    print("| library | top-1 | top-1 agreement with vitlab |")
    print("|---|---|---|")
    for k in right:
        share = f"{100 * agree[k] / n:.1f}%" if k in agree else "-"
        print(f"| {k} | {100 * right[k] / n:.2f}% | {share} |")


if __name__ == "__main__":
    main()

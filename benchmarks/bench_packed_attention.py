"""Block-diagonal attention over packed images (models/packed.py): which exact method is fastest on this CPU.

Methods, all computing softmax(q k^T / sqrt(d)) v within each image of packed sequences:

- ``split``: the images of each token count gathered into one batch, one ``F.scaled_dot_product_attention`` call
  a count, the outputs put back in place (vitlab's default, :class:`vitlab.models.packed.PackedAttention`);
- ``mask``: one SDPA call with a boolean ``(B, 1, S, S)`` block mask (``model.packed_attention = "mask"``);
- ``padded``: the images gathered into a ``(n, heads, L, d)`` batch padded to the longest, a key-padding mask,
  one SDPA call, scattered back;
- ``flex``: ``torch.nn.attention.flex_attention`` with a block mask, eager (forward only: torch has no CPU
  backward for it).

Each round times every method in turn (interleaved), forward without autograd and forward + backward; the
table gives the median over rounds, and the median over rounds of each method's time over ``split``'s in the
same round (less sensitive to load that changes between rounds). On a machine shared with other jobs the
numbers are noise: measure alone.

    PYTHONPATH=src python benchmarks/bench_packed_attention.py --rounds 11 --threads 2

``--train-step`` times whole training steps instead (forward, loss and backward, as ``vitlab train`` runs them,
``vitlab.accel`` on): the tiny model the auto recipe trains on photos under a short budget (patch 8, width 128,
depth 4, sin-cos 2-D positions) on a batch of 128 photo-shaped images with half their tokens dropped, packed
(``--pack``: ``split`` and ``mask``, into ``--pack-len``'s default) and square at 64 px (the model's own token
dropping), interleaved:

    PYTHONPATH=src python benchmarks/bench_packed_attention.py --train-step --rounds 15 --threads 2

``--loader`` times what feeds such a step: the packed loader's batches of 128 photo-shaped uint8 images (stored
with the shorter side at 73 px, as a 64-px run stores photos), kept resized after the first epoch (not timed),
flipped, normalised, patched, half their tokens dropped and packed, on the training thread (0 workers), an epoch
a round:

    PYTHONPATH=src python benchmarks/bench_packed_attention.py --loader --rounds 9 --threads 2
"""

from __future__ import annotations

import argparse
import random
import statistics
import types
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from _common import PackedAttention, packed_images, packed_loader

from vitlab.bench import time_calls

CONFIGS = {  # name: (tokens a sequence, sequences, width, heads, smallest and largest image in tokens)
    "S512-w192-small": (512, 4, 192, 3, 32, 160),
    "S1024-w384-photos": (1024, 2, 384, 6, 64, 256),
    "S1024-w192-many": (1024, 2, 192, 3, 16, 64),
}


def segments(seq_len: int, sequences: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    """Image lengths per sequence (random in [lo, hi] until the next would not fit), the rest one padding run."""
    rnd = random.Random(seed)
    out = []
    for _ in range(sequences):
        lens, used = [], 0
        while (n := rnd.randint(lo, hi)) + used <= seq_len:
            lens.append(n)
            used += n
        if used < seq_len:
            lens.append(seq_len - used)
        out.append(lens)
    return out


def context(segs: list[list[int]], seq_len: int) -> dict:
    ids = torch.full((len(segs), seq_len), -1)
    flat, k = [], 0
    for b, lens in enumerate(segs):
        o = 0
        for n in lens:
            ids[b, o : o + n] = k
            flat.append((b * seq_len + o, n))
            k, o = k + 1, o + n
    longest = max(n for _, n in flat)
    idx = torch.zeros(len(flat), longest, dtype=torch.long)
    valid = torch.zeros(len(flat), longest, dtype=torch.bool)
    for i, (s, n) in enumerate(flat):
        idx[i, :n], valid[i, :n] = torch.arange(s, s + n), True
    ctx = {"split": PackedAttention(ids, "split"), "mask": PackedAttention(ids, "mask"), "idx": idx, "valid": valid}
    assert ctx["split"].runs  # computed once, as in a forward (all blocks share it)
    try:
        from torch.nn.attention.flex_attention import create_block_mask

        def same_image(b, h, q, k):
            return ids[b, q] == ids[b, k]

        ctx["block_mask"] = create_block_mask(same_image, len(segs), None, seq_len, seq_len, device="cpu")
    except Exception:  # (no flex_attention in this torch)
        pass
    return ctx


def by_mask(q, k, v, ctx):
    return ctx["mask"].attend(q, k, v)


def by_split(q, k, v, ctx):
    return ctx["split"].attend(q, k, v)


def by_padding(q, k, v, ctx):
    b, h, s, d = q.shape
    idx, valid = ctx["idx"], ctx["valid"]

    def gather(t):
        return t.transpose(1, 2).reshape(b * s, h, d)[idx].transpose(1, 2)

    o = F.scaled_dot_product_attention(gather(q), gather(k), gather(v), attn_mask=valid[:, None, None, :])
    out = q.new_zeros(b * s, h, d).index_put((idx[valid],), o.transpose(1, 2)[valid])
    return out.view(b, s, h, d).transpose(1, 2)


def by_flex(q, k, v, ctx):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=ctx["block_mask"])


METHODS = {"split": by_split, "mask": by_mask, "padded": by_padding, "flex": by_flex}
FORWARDS, BACKWARDS = 5, 3
"""Calls a timed forward pass makes (without autograd), and forward + backward passes: a time is their mean."""


def passes(methods: dict, q, k, v, ctx, *, rounds: int) -> dict[str, dict[str, list[float]]]:
    """``method -> {"fwd": ms, "bwd": ms}`` over ``rounds``: each round times every method in turn, its forward
    then its forward + backward (on fresh leaf copies of q, k, v made outside the timing; flex: forward only)."""
    leaves: dict[str, list[torch.Tensor]] = {}

    def forward(f):
        def run() -> None:
            with torch.no_grad():
                for _ in range(FORWARDS):
                    f(q, k, v, ctx)

        return run

    def backward(m, f):
        def run() -> None:
            for _ in range(BACKWARDS):
                f(*leaves[m], ctx).sum().backward()

        return run

    def fresh(name: str, _round: int) -> None:
        m, _, part = name.partition(" ")
        if part == "bwd":
            leaves[m] = [t.clone().requires_grad_() for t in (q, k, v)]

    calls = {}
    for m, f in methods.items():
        calls[f"{m} fwd"] = forward(f)
        if m != "flex":
            calls[f"{m} bwd"] = backward(m, f)
    timed = time_calls(calls, rounds=rounds, alternate=False, setup=fresh)

    def ms(name: str, reps: int) -> list[float]:
        return [t / reps * 1e3 for t in timed[name].seconds] if name in timed else []

    return {m: {"fwd": ms(f"{m} fwd", FORWARDS), "bwd": ms(f"{m} bwd", BACKWARDS)} for m in methods}


PHOTO_SHAPES = ((64, 48), (48, 64), (56, 64), (64, 64), (72, 56), (40, 80))
"""Sides of the packed images (each about a 64-px square's tokens, at a photo's aspect ratio), in turn."""


def train_steps(*, rounds: int, batch: int = 128) -> None:
    """Median ms of a training step, packed (each attention method) and square, and each over the square's."""
    from vitlab.accel import FastVisionTransformer
    from vitlab.models import ViTConfig

    arch = dict(patch_size=8, embed_dim=128, depth=4, num_heads=4, mlp_dim=256, posemb="sincos2d", num_classes=10)
    g = torch.Generator().manual_seed(0)
    shapes = [PHOTO_SHAPES[i % len(PHOTO_SHAPES)] for i in range(batch)]
    tokens = [packed_images.drop_tokens(packed_images.patchify(torch.randn(3, h, w, generator=g), 8), 0.5,
                                        generator=g) for h, w in shapes]  # fmt: skip
    seq_len, seqs, used = 4 * (8 * 8 + 1), [[]], 0  # --pack-len's default: four 64-px images and their class tokens
    for t in tokens:
        if used + t.patches.shape[0] + 1 > seq_len:
            seqs, used = [*seqs, []], 0
        seqs[-1].append(t)
        used += t.patches.shape[0] + 1
    packed = packed_images.pack(seqs, seq_len=seq_len, prefix_tokens=1)
    square = torch.randn(batch, 3, 64, 64, generator=g)
    labels = torch.randint(0, 10, (batch,), generator=g)
    models = {"square": FastVisionTransformer(ViTConfig(img_size=(64, 64), patch_drop_rate=0.5, **arch)).train()}
    for method in ("split", "mask"):
        models[f"packed {method}"] = FastVisionTransformer(ViTConfig(img_size=(64, 64), **arch)).train()
        models[f"packed {method}"].packed_attention = method

    def step(name: str):
        def run() -> None:
            m = models[name]
            m.zero_grad()
            F.cross_entropy(m(square if name == "square" else packed), labels).backward()

        return run

    timed = time_calls({n: step(n) for n in models}, rounds=rounds, warmup=2)
    ms = {n: [t * 1e3 for t in timed[n].seconds] for n in models}
    print(f"a training step of {batch} images ({len(seqs)} packed sequences of {seq_len} tokens), median ms")
    print("| step | ms | over square |\n|---|---|---|")
    for n, times in ms.items():
        ratio = statistics.median(a / b for a, b in zip(times, ms["square"]))
        print(f"| {n} | {statistics.median(times):.1f} | {ratio:.2f} |")


def loader_batches(*, rounds: int, batch: int = 128, n: int = 1536) -> None:
    """Median ms of a packed training batch's loading, after the epoch that keeps the resized images."""
    g = torch.Generator().manual_seed(0)
    shapes = [((73, 97), (97, 73), (73, 73), (73, 130))[i % 4] for i in range(n)]
    split = types.SimpleNamespace(
        images=[torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=g).numpy() for h, w in shapes],
        labels=np.arange(n) % 10,
    )
    pf = packed_loader.Patchify(patch_size=8, resolution=(64, 64), mean=(0.5,) * 3, std=(0.25,) * 3, hflip=0.5)
    sized = packed_loader.SizedImages(split.images, pf)
    epochs = iter(range(rounds + 2))
    counts: list[int] = []

    def epoch() -> None:
        batches = packed_loader.SequenceBatches(
            source=split, patchify=pf, pack_len=4 * (8 * 8 + 1), prefix_tokens=1, images=batch, seed=0,
            epoch=next(epochs), token_drop=0.5, sized=sized,
        )  # fmt: skip
        counts.append(sum(1 for _ in batches))

    timed = time_calls({"loader": epoch}, rounds=rounds, warmup=1)  # the warm-up epoch resizes and keeps
    ms = [t * 1e3 / c for t, c in zip(timed["loader"].seconds, counts[1:], strict=True)]
    print(f"packed loader: {n} images, batches of {batch}: {statistics.median(ms):.1f} ms a batch (median of {rounds})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names of " + ", ".join(CONFIGS))
    ap.add_argument("--train-step", action="store_true", help="time whole training steps, packed and square")
    ap.add_argument("--loader", action="store_true", help="time the packed loader's batches")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    if args.train_step:
        train_steps(rounds=args.rounds)
        return
    if args.loader:
        loader_batches(rounds=args.rounds)
        return
    print(f"torch {torch.__version__}, {args.threads} threads, {args.rounds} rounds (median ms)")
    print("| config | images | method | forward | fwd / split | forward + backward | f+b / split | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.configs.split(","):
        seq_len, sequences, width, heads, lo, hi = CONFIGS[name]
        segs = segments(seq_len, sequences, lo, hi)
        ctx = context(segs, seq_len)
        methods = {m: f for m, f in METHODS.items() if m != "flex" or "block_mask" in ctx}
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(sequences, heads, seq_len, width // heads, generator=g) for _ in range(3))
        real = (ctx["mask"].image_ids >= 0)[:, None, :, None]  # (padding rows differ between methods)
        with torch.no_grad():
            ref = by_mask(q, k, v, ctx)
            diff = {m: float(((f(q, k, v, ctx) - ref) * real).abs().max()) for m, f in methods.items()}
        times = passes(methods, q, k, v, ctx, rounds=args.rounds)
        images = sum(len(s) for s in segs)  # (padding runs included)
        ref = times["split"]
        for m, tm in times.items():
            fwd, fwd_r = statistics.median(tm["fwd"]), statistics.median(a / b for a, b in zip(tm["fwd"], ref["fwd"]))
            if tm["bwd"]:
                both = f"{statistics.median(tm['bwd']):.2f}"
                both_r = f"{statistics.median(a / b for a, b in zip(tm['bwd'], ref['bwd'])):.2f}"
            else:
                both, both_r = "n/a (no CPU backward)", ""
            print(f"| {name} | {images} | {m} | {fwd:.2f} | {fwd_r:.2f} | {both} | {both_r} | {diff[m]:.1e} |")


if __name__ == "__main__":
    main()

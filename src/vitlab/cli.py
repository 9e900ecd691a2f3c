"""The ``vitlab`` command line.

Each sub-command lives in ``vitlab/commands/<name>.py`` and exposes
``add_parser(subparsers)``; that function must import nothing heavy, so
``vitlab --help`` stays fast. Errors meant for the user (``VitlabError`` and
bad values) print one line and exit 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ._version import __version__

# Order = order in `vitlab --help`.
COMMANDS = ["models", "convert", "train", "finetune", "eval", "predict", "inspect", "fewshot", "bench", "export"]


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vitlab",
        description=(
            "The Vision Transformer (Dosovitskiy et al., ICLR 2021): create, load, train, fine-tune, inspect, bench."
        ),
        epilog=(
            "examples:\n  vitlab models\n"
            "  vitlab train            # the main job: a ViT on the embedded digits, < 60 s\n"
            "  vitlab convert vit_b16.npz out/vit_b16"
        ),
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"vitlab {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f".commands.{name.replace('-', '_')}", __package__)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith(f"{__package__}.commands."):
                continue  # command not built yet
            raise
        mod.add_parser(sub, _Formatter)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        # `vitlab` alone: the main job is `vitlab train`; show help instead of guessing.
        parser.print_help()
        return 0
    from .errors import VitlabError

    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("vitlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `vitlab models | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (VitlabError, ValueError, FileNotFoundError, NotADirectoryError, PermissionError, KeyError) as e:
        if args.debug:
            raise
        msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"vitlab {args.command}: error: {msg.splitlines()[0] if msg else type(e).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

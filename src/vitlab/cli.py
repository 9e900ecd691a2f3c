"""The ``vitlab`` command line.

Each sub-command lives in ``vitlab/commands/<name>.py`` and exposes
``add_parser(subparsers)``; that function must import nothing heavy, so
``vitlab --help`` stays fast. Errors meant for the user (``VitlabError`` and
bad values) print one line and exit 2; ``--debug`` shows the traceback. What the
library warns (``warnings.warn``: an assumption about a checkpoint, an ignored
value) is one escaped line too, each text once; ``--debug`` shows Python's own.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Callable, Sequence

from ._version import __version__

# Order = order in `vitlab --help`.
COMMANDS = [
    "models",
    "convert",
    "train",
    "finetune",
    "eval",
    "predict",
    "inspect",
    "fewshot",
    "bench",
    "export",
    "plan",
    "cache",
    "data",
]


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Examples kept as written; ``(default: X)`` added only when it says something: not for
    ``None`` / ``False`` (unset; the help or the group title says what then happens) and not when
    the help already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text.lower():
            return text
        return super()._get_help_string(action)


# timm's train.py spellings -> vitlab's, for the hint on an unknown flag (`train` and `finetune`).
TIMM_FLAGS = {
    "-b": "--batch-size",
    "--output": "--out",
    "--smoothing": "--label-smoothing",
    "--pretrained": "vitlab finetune --init MODEL",
    "--initial-checkpoint": "vitlab finetune --init MODEL",
    "--opt": "--optimizer",
    "--sched": "--schedule",
    "--drop": "--dropout",
    "--reprob": "--random-erasing",
    "--aa": "--randaugment N,M",
    "--model-ema-decay": "--ema",
    "--model-ema": "--ema DECAY",
    "-j": "--workers",
    "--amp": "--precision bf16",
    "--input-size": "--img-size",
    "--data-dir": "--data",
    "--num-classes": "nothing: the classes come from --data",
    "--warmup-lr": "nothing: warmup starts at 0",
}


def _unknown_args(parser: argparse.ArgumentParser, command: str | None, extra: list[str]) -> None:
    """Exit 2 under the sub-command's usage (not the top level's) naming the unknown arguments,
    with the vitlab spelling of timm-style flags or the closest options."""
    import difflib

    sub = _subparser(parser, command) or parser
    known = [s for a in sub._actions for s in a.option_strings]
    hints = []
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("-"):
            continue
        if command in ("train", "finetune") and flag in TIMM_FLAGS:
            hints.append(f"{flag}: vitlab spells it {TIMM_FLAGS[flag]}")
        elif close := difflib.get_close_matches(flag, known, n=2, cutoff=0.6):
            hints.append(f"{flag}: did you mean {' or '.join(close)}?")
    sub.error(f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else ""))


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
    parser.add_argument(
        "--debug", action="store_true", help="show full tracebacks on errors (before or after the command)"
    )
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
    args, extra = parser.parse_known_args(argv)
    if "--debug" in extra:  # `vitlab train ... --debug`: the top-level flag, given after the command
        extra = [a for a in extra if a != "--debug"]
        args.debug = True
    if extra:
        _unknown_args(parser, getattr(args, "command", None), extra)
    if not getattr(args, "func", None):
        # `vitlab` alone: the main job is `vitlab train`; show help instead of guessing.
        parser.print_help()
        return 0
    from .errors import ConfigError, VitlabError

    _escaping_streams()
    try:
        with warnings.catch_warnings():
            if not args.debug:
                warnings.showwarning = _warning_lines(args.command)
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
        from ._text import shown

        msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        if isinstance(e, ConfigError) and e.option and e.problem is not None and msg.startswith(f"{e.option}: "):
            msg = f"{_flag(parser, args.command, e.option)}: {e.problem}"  # a model field, as this command spells it
        line = shown(msg.splitlines()[0]) if msg else type(e).__name__  # names from files: escaped
        print(f"vitlab {args.command}: error: {line}", file=sys.stderr)
        return 2


def _flag(parser: argparse.ArgumentParser, command: str, option: str) -> str:
    """The flag of ``command`` that sets the model field ``option`` (``img_size`` -> ``--img-size``), or ``option``
    itself where the command has none: a :class:`~vitlab.errors.ConfigError` of the library names its field, and a
    remedy only Python has (``dynamic_img_pad=True``) stays out of the command line's line."""
    sub = _subparser(parser, command)
    for a in sub._actions if sub is not None else ():
        if a.dest == option and a.option_strings:
            return max(a.option_strings, key=len)
    return option


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser | None:
    """The parser of the sub-command ``command`` (``vitlab train``'s), or None."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return None


def _escaping_streams() -> None:
    """Standard output and error write a character their encoding cannot hold as its escape (``\\u51ac``) instead of
    failing: a class folder named in Chinese or French, printed where Python's streams are not UTF-8 (a latin-1 locale,
    ``PYTHONIOENCODING=ascii``, a redirected stream on Windows), once ended ``predict``, ``eval`` and ``data check``
    with ``'ascii' codec can't encode character``. UTF-8 streams are left as they are."""
    import codecs

    for stream in (sys.stdout, sys.stderr):
        encoding, reconfigure = getattr(stream, "encoding", None), getattr(stream, "reconfigure", None)
        if encoding and reconfigure is not None and codecs.lookup(encoding).name != "utf-8":
            reconfigure(errors="backslashreplace")


def _warning_lines(command: str) -> Callable[..., None]:
    """A ``warnings.showwarning`` for the command line: the library's warning as one line under the command's name,
    like its errors (``vitlab finetune: warning: ...``), escaped (it may quote a file's names), each text once (a
    checkpoint read twice warns twice from two places); not Python's file, line number and source line, which say
    nothing to a user."""
    from ._text import shown

    said: set[str] = set()

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file=None, line=None):
        text = shown(" ".join(str(message).split()))
        if text not in said:
            said.add(text)
            print(f"vitlab {command}: warning: {text}", file=file or sys.stderr)

    return show


if __name__ == "__main__":
    raise SystemExit(main())

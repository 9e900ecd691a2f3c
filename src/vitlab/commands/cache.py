"""``vitlab cache ls|clear``: the decode caches that training on a folder writes (``~/.cache/vitlab``)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    from ..train.spec.kinds import parse_duration

    p = sub.add_parser(
        "cache",
        help="list or clear the decoded-image caches (~/.cache/vitlab)",
        description=(
            "Training or evaluating on an image folder decodes it once into a cache (default ~/.cache/vitlab,\n"
            "or $VITLAB_CACHE, or --cache-dir). List those caches, or delete them; a deleted cache is decoded\n"
            "again by the next run that needs it.\n\n"
            "examples:\n  vitlab cache ls\n  vitlab cache clear --older-than 7d"
        ),
        formatter_class=formatter,
    )
    p.add_argument("action", choices=["ls", "clear"], help="ls: list the caches; clear: delete them")
    p.add_argument("--cache-dir", default=None, help="cache folder (default ~/.cache/vitlab or $VITLAB_CACHE)")
    p.add_argument(
        "--older-than",
        type=parse_duration,
        default=None,
        metavar="AGE",
        help="clear: only caches last written more than AGE ago (e.g. 7d, 12h)",
    )
    p.set_defaults(func=run)


def _age(seconds: float) -> str:
    for unit, s in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= s:
            return f"{seconds / s:.1f}{unit}"
    return f"{max(0.0, seconds):.0f}s"


def run(args: argparse.Namespace) -> int:
    import time

    from .._units import format_size
    from ..data.cache import default_cache_dir
    from ..data.cache_admin import clear_caches, list_caches
    from ..errors import ConfigError

    where = args.cache_dir or str(default_cache_dir())
    if args.action == "ls":
        if args.older_than is not None:
            raise ConfigError("--older-than is for `vitlab cache clear`")
        entries = list_caches(where)
        now = time.time()
        if not entries:
            print(f"no decode caches under {where}")
            return 0
        print(f"{'size':>10}{'images':>9}{'age':>8}  {'source':<40} file")
        for e in entries:
            age = _age(now - e.mtime)
            print(f"{format_size(e.bytes):>10}{e.images:>9}{age:>8}  {e.source or '?':<40} {e.path.name}")
        print(f"{len(entries)} cache(s), {format_size(sum(e.bytes for e in entries))} under {where}")
        return 0
    gone = clear_caches(where, older_than=args.older_than)
    kept = len(list_caches(where))
    print(
        f"deleted {len(gone)} cache(s), {format_size(sum(e.bytes for e in gone))} under {where}"
        + (f"; kept {kept} newer" if kept else "")
    )
    return 0

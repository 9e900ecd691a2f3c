"""``vitlab cache ls|clear``: the decode caches that training on a folder writes (``~/.cache/vitlab``)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    from ..train.conf.kinds import parse_duration

    p = sub.add_parser(
        "cache",
        help="list, clear or cap the decoded-image caches (~/.cache/vitlab)",
        description=(
            "Training or evaluating on an image folder decodes it once into a cache (default ~/.cache/vitlab,\n"
            "or $VITLAB_CACHE, or --cache-dir). List those caches, delete them, or cap what they take: before a\n"
            "new cache is built, the least recently used ones that no running job reads are deleted until all\n"
            "fit the cap (default 20 GiB; $VITLAB_CACHE_MAX_SIZE wins over the setting). A deleted cache is\n"
            "decoded again by the next run that needs it. Only vitlab's own cache files are ever deleted; ls and\n"
            "clear also count and delete the hashes vitlab data check keeps there.\n\n"
            "examples:\n  vitlab cache ls\n  vitlab cache clear --older-than 7d\n"
            "  vitlab cache limit 50G     # the cap, kept in the cache folder's cache-settings.json\n"
            "  vitlab cache limit         # show it"
        ),
        formatter_class=formatter,
    )
    p.add_argument(
        "action",
        choices=["ls", "clear", "limit"],
        help="ls: list the caches; clear: delete them; limit: show or set the cap",
    )
    p.add_argument(
        "size",
        nargs="?",
        default=None,
        metavar="SIZE",
        help="limit: the cap (20G, 512MiB; none: no cap; default: back to the default)",
    )
    p.add_argument("--cache-dir", default=None, help="cache folder (default ~/.cache/vitlab or $VITLAB_CACHE)")
    p.add_argument(
        "--older-than",
        type=parse_duration,
        default=None,
        metavar="AGE",
        help="clear: only caches last used more than AGE ago (e.g. 7d, 12h)",
    )
    p.set_defaults(func=run)


def _age(seconds: float) -> str:
    for unit, s in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= s:
            return f"{seconds / s:.1f}{unit}"
    return f"{max(0.0, seconds):.0f}s"


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    from .._text import shown
    from .._units import format_size
    from ..data.cache.admin import clear_caches, list_caches
    from ..data.cache.limit import MAX_SIZE_ENV, cache_limit, make_room, set_cache_limit
    from ..data.cache.store import default_cache_dir
    from ..data.check.records import kept_hashes
    from ..errors import ConfigError

    where = args.cache_dir or str(default_cache_dir())
    if args.size is not None and args.action != "limit":
        raise ConfigError(f"{args.size}: a size is for `vitlab cache limit SIZE`")
    if args.older_than is not None and args.action != "clear":
        raise ConfigError(f"--older-than is for `vitlab cache clear`, not {args.action}")
    if args.action == "limit":
        limit = set_cache_limit(where, args.size) if args.size is not None else cache_limit(where)
        if limit.warning:
            print(f"warning: {shown(limit.warning)}", file=sys.stderr)
        if args.size is not None and limit.source == f"${MAX_SIZE_ENV}":
            print(f"note: ${MAX_SIZE_ENV} is set: it wins over the setting written", file=sys.stderr)
        total = sum(e.bytes for e in list_caches(where))
        print(f"decode caches under {shown(where)}: {format_size(total)}; cap {shown(limit.describe())}")
        if args.size is not None:
            make_room(where, 0, name="the caches")  # a lower cap applies now
        return 0
    hashes = kept_hashes(where)  # (ls and clear: limit returned above)
    hashes_line = (
        f"{len(hashes)} file(s) of hashes vitlab data check kept, {format_size(sum(h.bytes for h in hashes))} "
        "(cleared with the caches: the next check reads its files again)"
    )
    if args.action == "ls":
        entries = list_caches(where)
        now = time.time()
        if not entries:
            print(f"no decode caches under {shown(where)}" + (f"; {hashes_line}" if hashes else ""))
            return 0
        print(f"{'size':>10}{'images':>9}{'used':>8}  {'source':<40} file")
        for e in entries:
            age = _age(now - e.mtime)
            print(f"{format_size(e.bytes):>10}{e.images:>9}{age:>8}  {shown(e.source or '?'):<40} {shown(e.path.name)}")
        total = sum(e.bytes for e in entries)
        cap = shown(cache_limit(where).describe())
        print(f"{len(entries)} cache(s), {format_size(total)} under {shown(where)}; cap {cap}")
        if hashes:
            print(hashes_line)
        return 0
    gone = clear_caches(where, older_than=args.older_than)
    kept = len(list_caches(where))
    now = time.time()
    old = [h for h in hashes if args.older_than is None or now - h.mtime > args.older_than]
    for h in old:
        h.path.unlink(missing_ok=True)
    print(
        f"deleted {len(gone)} cache(s), {format_size(sum(e.bytes for e in gone))} under {shown(where)}"
        + (f", and {len(old)} file(s) of data check hashes, {format_size(sum(h.bytes for h in old))}" if old else "")
        + (f"; kept {kept} newer" if kept else "")
    )
    return 0

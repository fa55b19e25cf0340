"""``compress search``: search a pipeline's settings.

Each command registers itself (``add_parsers``); the heavy imports are inside the commands, so
``compress --help`` stays fast."""
from __future__ import annotations

import argparse
from pathlib import Path

from compress.commands.common import console


def _cmd_search(args: argparse.Namespace) -> int:
    from compress.pipeline.interruption import interruptible
    from compress.search.driver import JOURNAL, Search
    from compress.search.search_report import REPORT_DIR, summary_line
    from compress.search.settings import load_search

    plan = load_search(args.search, args.overrides)
    search = Search(plan, console(), Path(args.run_dir) if args.run_dir else None)
    again = f"compress search {args.search}" + (f" --run-dir {args.run_dir}" if args.run_dir else "")
    result = interruptible(search.run, lambda: f"the finished trials are kept in {search.dir / JOURNAL} and the "
                                                "trials' folders", f"continue with: {again}")
    out = console(stderr=False)
    out.print(summary_line(result.report), highlight=False)
    out.print(f"search report: {search.dir / REPORT_DIR / 'search.md'} (and search.html, search.json, pareto.png)",
              highlight=False)
    return 0 if result.chosen else 1


def add_parsers(sub) -> None:
    search = sub.add_parser(
        "search", help="search pipeline settings for the fastest artifact within the red line (needs .[search])",
        description="Runs the hand-set pipeline a search file names, then trials that change the settings its space "
                    "names (proposed by Optuna, built in parallel on Ray, each measured with the machine to itself), "
                    "then measures the best ones again with the hand-set result in one interleaved bench and writes "
                    "the chosen configuration as a pipeline file. Exit 0: a configuration was chosen; 1: none passed "
                    "the gate. An interrupted search continues where it stopped.")
    search.add_argument("search", metavar="SEARCH_FILE")
    search.add_argument("--run-dir", help="the search directory (default: the file's run_dir, else runs/<name>)")
    search.add_argument("overrides", nargs="*", metavar="key=value", default=[], help="search fields, e.g. trials=16")
    search.set_defaults(func=_cmd_search)

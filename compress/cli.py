"""The compress command line.

Exit codes: 0 success, 1 the release gate said no, 2 invalid input, 3 a stage failed.
"""
# A launcher (this docstring is `compress --help`'s text): each command lives in compress/commands/ (doctor in
# compress/doctor/command.py) and registers its own arguments; here they are parsed, dispatched, and every error
# turned into one clean line and its exit code.
from __future__ import annotations

import argparse
import errno
import sys
import traceback

from compress import __version__
from compress.commands import pipeline_runs, releases, reports, search
from compress.commands.common import console
from compress.doctor.command import add_parser as add_doctor_parser
from compress.errors import CompressError, RunInterrupted


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compress", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"compress {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for commands in (pipeline_runs, reports, search, releases):
        commands.add_parsers(sub)
    add_doctor_parser(sub, console)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Overrides may follow options (`run p.yaml --force train seed=1`); argparse leaves those unparsed.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(item.startswith("-") or "=" not in item for item in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    try:
        return args.func(args)
    except CompressError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"{'' if isinstance(exc, RunInterrupted) else 'error: '}{exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted; completed stages are kept and a re-run resumes from the last checkpoint", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        if args.debug:
            traceback.print_exc()
        print(f"error: the disk is full (writing {exc.filename or 'a file'}): nothing half-written was kept or "
              "recorded, and the files from before are intact; free space and run the same command again",
              file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())

"""``compress gate | compare | report``: read a bench report again: the gate under other limits, the report
re-rendered, runs compared.

Each command registers itself (``add_parsers``); the heavy imports are inside the commands, so
``compress --help`` stays fast."""
from __future__ import annotations

import argparse
from pathlib import Path

from typing import TYPE_CHECKING

from compress.commands.common import console
from compress.errors import ConfigError

if TYPE_CHECKING:
    from serve_bench.report_model import Report


def _warn_if_foreign(report: Report, path: Path) -> None:
    from compress.pipeline.bench_report import foreign_isa_note

    if note := foreign_isa_note(report, path):
        console(stderr=True).print(note, style="yellow", highlight=False)


def _cmd_gate(args: argparse.Namespace) -> int:
    from serve_bench.gate import evaluate
    from serve_bench.report_model import Gate

    from compress.pipeline.bench_report import load_report, print_gate

    from compress.config import Latency, RedLine, limit_problem

    for flag, value, section, field in (("--p99-ms", args.p99_ms, Latency, "latency.p99_budget_ms"),
                                        ("--max-drop", args.max_drop, RedLine, "red_line.max_drop")):
        problem = None if value is None else limit_problem(value, section, field.split(".")[1])
        if problem:  # the same value in a pipeline file is refused by validation: bad input, not a verdict
            raise ConfigError(f"{flag} {value:g}: {problem} (the rule of {field} in a pipeline file); give a value "
                              "in that range")
    report, path = load_report(Path(args.target))
    _warn_if_foreign(report, path)
    limits = report.gate.limits.limits().replace(p99_budget_ms=args.p99_ms, max_drop=args.max_drop,
                                                 decision=args.decision)
    gate = Gate.model_validate(evaluate(report.artifacts, limits,
                                        accuracy_meaningful=report.data.meaningful_accuracy))
    print_gate(gate, path, console(stderr=False))  # a judgement under other limits: the saved report is kept
    return 0 if gate.passed else 1


def _cmd_compare(args: argparse.Namespace) -> int:
    from compress.pipeline.compare import compare_runs, default_out

    if len(args.run_dirs) < 2:
        raise ConfigError("compress compare: give at least two run directories (the first is the reference)")
    if args.repeats < 1:
        raise ConfigError("--repeats: give 1 or more")
    out = Path(args.out) if args.out else default_out()
    compare_runs([Path(d) for d in args.run_dirs], out, console(), artifact=args.artifact, repeats=args.repeats)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from compress.pipeline.bench_report import load_report, rerender

    report, path = load_report(Path(args.run_dir))
    _warn_if_foreign(report, path)
    folder = rerender(report, path)
    print(f"re-rendered {folder / 'report.md'}, {folder / 'report.html'} and the plots")
    return 0


def add_parsers(sub) -> None:
    gate = sub.add_parser("gate", help="re-evaluate a saved report's release gate; exit 0 ship, 1 don't")
    gate.add_argument("target", metavar="RUN_DIR|REPORT", help="a run directory or a report.json")
    gate.add_argument("--p99-ms", type=float, help="p99 budget in ms, > 0 (default: the report's)")
    gate.add_argument("--max-drop", type=float, help="accuracy red line in points, 0 to 100 (default: the report's)")
    gate.add_argument("--decision", choices=["point", "confident"],
                      help="confident: the drop's and the p99's 95%% upper bounds must be within the limits; "
                           "point: the estimates (default: the report's, i.e. the pipeline's gate.decision)")
    gate.set_defaults(func=_cmd_gate)

    compare = sub.add_parser("compare", help="benchmark the artifacts of several runs in one interleaved measurement")
    compare.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="two or more run directories; the first "
                                                                        "is the reference")
    compare.add_argument("--artifact", help="the artifact to take from every run (default: each run's released one)")
    compare.add_argument("--out", help="report folder (default: runs/compare-<date>-<time>)")
    compare.add_argument("--repeats", type=int, default=1, help="repeat the whole measurement (run-to-run spread)")
    compare.set_defaults(func=_cmd_compare)

    report = sub.add_parser("report", help="re-render a run's report and plots without measuring again")
    report.add_argument("run_dir")
    report.set_defaults(func=_cmd_report)

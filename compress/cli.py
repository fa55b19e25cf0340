"""The compress command line.

Exit codes: 0 success, 1 the release gate said no, 2 invalid input, 3 a stage failed.
"""
from __future__ import annotations

import argparse
import errno
import json
import sys
import traceback
from pathlib import Path

from compress import __version__
from compress.doctor.command import add_parser as add_doctor_parser
from compress.errors import CompressError, ConfigError, RunInterrupted


def _console(stderr: bool = True):
    from compress.pipeline.console_log import cli_console

    return cli_console(stderr)


def _cmd_run(args: argparse.Namespace) -> int:
    from compress.pipeline.inspect_view import render
    from compress.pipeline.pipeline_file import load_pipeline
    from compress.pipeline.runner import RunOptions, Runner, default_run_dir

    pipeline = load_pipeline(args.pipeline, args.overrides)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(pipeline)
    options = RunOptions(only=args.only, from_stage=args.from_stage, force=set(args.force or []),
                         reuse_run_dir=args.reuse_run_dir)
    runner = Runner(pipeline, run_dir, _console(), options)
    manifest = _run_interruptible(runner, f"compress run {args.pipeline} --run-dir {run_dir}")
    render(run_dir, _console(stderr=False))
    return _gate_exit_code(manifest, runner.selected_names, run_dir)


def _run_interruptible(runner, resume: str):
    """Run; on Ctrl-C or SIGTERM say in one line what was kept and how to resume, and exit 130 / 143."""
    from compress.pipeline.interruption import interruptible, kept_line

    return interruptible(runner.run, lambda: kept_line(runner), f"resume with: {resume}")


def _gate_exit_code(manifest, selected: list[str], run_dir: Path) -> int:
    """1 when a bench stage of this invocation said no, so CI sees a failed gate however the stage was run."""
    for name in selected:
        if (record := manifest.stages.get(name)) and record.kind == "bench" and record.metrics.get("gate_passed") is False:
            reasons = "; ".join(record.metrics.get("gate_reasons", []))
            print(f"release gate FAILED ({name}): {reasons}; report in {run_dir / name / 'report'}", file=sys.stderr)
            return 1
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from compress.pipeline.pipeline_file import load_pipeline

    from compress.pipeline.preflight import NOT_CHECKED, preflight

    pipeline = load_pipeline(args.pipeline, args.overrides)
    preflight(pipeline)
    print(f"{args.pipeline}: valid ({len(pipeline.stages)} stages: {', '.join(s.name for s in pipeline.stages)}); "
          f"not checked without running: {NOT_CHECKED}")
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from compress.pipeline.schema import pipeline_json_schema

    print(json.dumps(pipeline_json_schema(), indent=2))
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from compress.pipeline.inspect_view import render

    render(Path(args.run_dir), _console(stderr=False))
    return 0


def _warn_if_foreign(report: dict, path: Path) -> None:
    from compress.pipeline.bench_report import foreign_isa_note

    if note := foreign_isa_note(report, path):
        _console(stderr=True).print(note, style="yellow", highlight=False)


def _cmd_gate(args: argparse.Namespace) -> int:
    from serve_bench.gate import evaluate
    from serve_bench.limits import Limits

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
    limits = Limits.from_dict(report["gate"]["limits"]).replace(p99_budget_ms=args.p99_ms, max_drop=args.max_drop,
                                                                  decision=args.decision)
    result = evaluate(report["artifacts"], limits,
                      accuracy_meaningful=(report.get("data") or {}).get("meaningful_accuracy", True))
    print_gate(result, path, _console(stderr=False))
    return 0 if result["passed"] else 1


def _cmd_compare(args: argparse.Namespace) -> int:
    from compress.pipeline.compare import compare_runs, default_out

    if len(args.run_dirs) < 2:
        raise ConfigError("compress compare: give at least two run directories (the first is the reference)")
    if args.repeats < 1:
        raise ConfigError("--repeats: give 1 or more")
    out = Path(args.out) if args.out else default_out()
    compare_runs([Path(d) for d in args.run_dirs], out, _console(), artifact=args.artifact, repeats=args.repeats)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from compress.pipeline.bench_report import load_report, rerender

    report, path = load_report(Path(args.run_dir))
    _warn_if_foreign(report, path)
    folder = rerender(report, path)
    print(f"re-rendered {folder / 'report.md'}, {folder / 'report.html'} and the plots")
    return 0


def _parse_inputs(items: list[str]) -> dict[str, Path]:
    inputs = {}
    for item in items:
        role, sep, path = item.partition("=")
        if not sep or not role or not path:
            raise ConfigError(f"--input {item!r}: write ROLE=PATH, e.g. --input model=runs/q/train/model")
        inputs[role] = Path(path)
    return inputs


def _cmd_stage(args: argparse.Namespace) -> int:
    import yaml

    from compress.pipeline.inspect_view import render
    from compress.pipeline.pipeline_file import apply_override, build_pipeline
    from compress.pipeline.runner import RunOptions, Runner

    if args.pipeline:
        try:
            base = yaml.safe_load(Path(args.pipeline).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"--pipeline {args.pipeline}: cannot read it ({exc})") from exc
        base = {k: v for k, v in base.items() if k != "stages"} if isinstance(base, dict) else {}
    else:
        base = {"data": {"name": args.data},  # an ONNX file (model.onnx=...) has no architecture name
                "model": {} if any(o.startswith("model.onnx=") for o in args.overrides) else {"name": args.model}}
    raw = {**base, "name": f"{args.kind}-alone", "stages": [{"name": args.kind, "kind": args.kind}]}
    if args.seed is not None:
        raw["seed"] = args.seed
    for assignment in args.overrides:
        apply_override(raw, stage_scoped(assignment, args.kind))
    pipeline = build_pipeline(raw, f"compress stage {args.kind}")
    run_dir = Path(args.run_dir or Path("runs") / f"{args.kind}-alone")
    options = RunOptions(force={args.kind} if args.force else set(), external_inputs=_parse_inputs(args.input),
                         reuse_run_dir=args.reuse_run_dir)
    runner = Runner(pipeline, run_dir, _console(), options)
    manifest = _run_interruptible(runner, "the same compress stage command")
    render(run_dir, _console(stderr=False))
    return _gate_exit_code(manifest, runner.selected_names, run_dir)


def stage_scoped(assignment: str, kind: str) -> str:
    """Where ``compress stage KIND key=value`` puts an assignment, from the schemas themselves: a field of the stage's
    own settings goes to the stage (``threads=`` of a bench is its timing threads), another field of the pipeline
    file to the pipeline (``nms.iou=``, ``task=``, ``tracking.uri=``), anything else to the stage, which refuses it
    by name. ``stages.KIND.key=value`` is taken as written."""
    from compress.config import PipelineConfig
    from compress.stages import registry

    top = assignment.split("=", 1)[0].split(".", 1)[0]
    stage = registry.get(kind)
    own = set(stage.Config.model_fields) if stage is not None else set()
    if top == "stages" or (top not in own and top in set(PipelineConfig.model_fields) - {"name"}):
        return assignment
    return f"stages.{kind}.{assignment}"


def _cmd_search(args: argparse.Namespace) -> int:
    from compress.pipeline.interruption import interruptible
    from compress.search.driver import JOURNAL, Search
    from compress.search.search_report import REPORT_DIR, summary_line
    from compress.search.settings import load_search

    plan = load_search(args.search, args.overrides)
    search = Search(plan, _console(), Path(args.run_dir) if args.run_dir else None)
    again = f"compress search {args.search}" + (f" --run-dir {args.run_dir}" if args.run_dir else "")
    result = interruptible(search.run, lambda: f"the finished trials are kept in {search.dir / JOURNAL} and the "
                                                "trials' folders", f"continue with: {again}")
    out = _console(stderr=False)
    out.print(summary_line(result.report), highlight=False)
    out.print(f"search report: {search.dir / REPORT_DIR / 'search.md'} (and search.html, search.json, pareto.png)",
              highlight=False)
    return 0 if result.chosen else 1


def _cmd_release(args: argparse.Namespace) -> int:
    from compress.release.bundle import make_release
    from compress.release.console_view import print_release

    release = make_release(Path(args.run_dir), Path(args.to), anyway=args.anyway, artifact=args.artifact)
    print_release(release, _console(stderr=False))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from compress.release.console_view import print_verification
    from compress.release.verify import verify_bundle

    result = verify_bundle(Path(args.bundle), Path(args.images) if args.images else None, threads=args.threads)
    print_verification(result, args.bundle, _console(stderr=False))
    return 0 if result.ok else 1


def _cmd_images(args: argparse.Namespace) -> int:
    from compress.release.split_images import write_run_split

    count = write_run_split(Path(args.run_dir), args.split, Path(args.to))
    print(f"wrote the {count} images of the {args.split} split to {args.to} (one folder per class)")
    return 0


def _cmd_join(args: argparse.Namespace) -> int:
    from compress.pipeline.console_log import to_console
    from compress.pipeline.distributed_launch import join_stage
    from compress.pipeline.pipeline_file import load_pipeline
    from compress.pipeline.runner import default_run_dir
    from compress.pipeline.pipeline_data import load_section

    pipeline = load_pipeline(args.pipeline, args.overrides)
    pipeline.stage(args.stage)  # a stage of this pipeline, or a clear error
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(pipeline)
    with to_console(_console()):
        join_stage(run_dir, args.stage, args.node_rank, args.wait, lambda: load_section(pipeline.config.data, pipeline.source))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compress", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"compress {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a pipeline (cached stages are skipped)")
    run.add_argument("pipeline")
    run.add_argument("--run-dir", help="default: the pipeline's run_dir, else runs/<name>")
    run.add_argument("--only", metavar="STAGE", help="run only this stage, its inputs taken from the manifest")
    run.add_argument("--from", dest="from_stage", metavar="STAGE", help="re-run this stage and every later one")
    run.add_argument("--force", metavar="STAGE", action="append", help="re-run this stage even if cached (repeatable)")
    run.add_argument("--reuse-run-dir", action="store_true",
                     help="run into a run directory that holds another pipeline's run (refused otherwise)")
    run.add_argument("overrides", nargs="*", metavar="key=value", default=[],
                     help="e.g. stages.train.epochs=3 seed=1")
    run.set_defaults(func=_cmd_run)

    validate = sub.add_parser(
        "validate", help="check a pipeline file without running it",
        description="Checks the schema of every field, stage references, and what the file names: the data source "
                    "(folder, class folders, images found, without decoding them), every model name or "
                    "'package.module:callable', 3-channel input for torchvision models, weights files. Not checked "
                    "(only running tells): whether every image decodes, whether a user model accepts its "
                    "arguments and the data's shape, whether training converges, whether a TensorRT engine builds.")
    validate.add_argument("pipeline")
    validate.add_argument("overrides", nargs="*", metavar="key=value", default=[])
    validate.set_defaults(func=_cmd_validate)

    schema = sub.add_parser("schema", help="print the pipeline file's JSON schema (for editors)")
    schema.set_defaults(func=_cmd_schema)

    inspect = sub.add_parser("inspect", help="show a run's stages, metrics and artifacts")
    inspect.add_argument("run_dir")
    inspect.set_defaults(func=_cmd_inspect)

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

    join = sub.add_parser("join", help="take part, from another machine, in a stage node 0 runs on several machines",
                          description="Run on every machine but node 0 of a `distributed: {nnodes: N}` stage, with "
                                      "the run directory shared (same --run-dir): waits for node 0's `compress run` "
                                      "to launch the stage, then starts this machine's processes with torchrun.")
    join.add_argument("pipeline")
    join.add_argument("--stage", required=True, help="the stage to join")
    join.add_argument("--node-rank", type=int, required=True, help="this machine's place, 1…nnodes-1")
    join.add_argument("--run-dir", help="the shared run directory (default: as `compress run` would choose)")
    join.add_argument("--wait", type=float, default=3600.0, help="seconds to wait for node 0's launch")
    join.add_argument("overrides", nargs="*", metavar="key=value", default=[])
    join.set_defaults(func=_cmd_join)

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

    release = sub.add_parser("release", help="bundle the released artifact with its model card and checksums",
                             description="Copies the artifact the run's release gate released (and the TensorRT "
                                         "engines of the same model that the bench measured and the gate passes), "
                                         "the report, the resolved pipeline, MODEL_CARD.md, model_card.json and "
                                         "SHA256SUMS into a new folder. Exit 1 (nothing written) when the gate did "
                                         "not release it, unless --anyway; exit 2 (nothing written, --anyway or "
                                         "not) when the file is not the one the report's bench measured.")
    release.add_argument("run_dir")
    release.add_argument("--to", required=True, help="the bundle folder (new, or empty)")
    release.add_argument("--anyway", action="store_true", help="bundle even where the gate said no (marked so)")
    release.add_argument("--artifact", help="with --anyway: this artifact instead of the fastest measured one")
    release.set_defaults(func=_cmd_release)

    verify = sub.add_parser("verify", help="check a release bundle: digests, the file loads, the card's accuracy",
                            description="Exit 0: every check asked for was made and held; 1: one failed, or could "
                                        "not be made here (a TensorRT engine without TensorRT or its GPU, and then "
                                        "its accuracy); 2: invalid input. On images other than the card's own, the "
                                        "99%% interval of the difference of the two accuracies must contain 0.")
    verify.add_argument("bundle")
    verify.add_argument("images", nargs="?", help="a folder of labelled images (one sub-folder per class) to "
                                                  "reproduce the card's accuracy on, e.g. from compress images")
    verify.add_argument("--threads", type=int, help="inference threads (default: physical cores)")
    verify.set_defaults(func=_cmd_verify)

    images = sub.add_parser("images", help="write a split of a run's data as image files, one folder per class")
    images.add_argument("run_dir")
    images.add_argument("--split", choices=["train", "val", "calib", "test"], default="test")
    images.add_argument("--to", required=True, help="a new folder")
    images.set_defaults(func=_cmd_images)

    stage = sub.add_parser("stage", help="run one stage alone, inputs given as paths")
    stage.add_argument("kind")
    stage.add_argument("--pipeline", help="take data, model, seed and limits from this pipeline file")
    stage.add_argument("--data", default="mnist5k", help="data set name (without --pipeline)")
    stage.add_argument("--model", default="resnet20", help="model name (without --pipeline)")
    stage.add_argument("--seed", type=int)
    stage.add_argument("--input", action="append", default=[], metavar="ROLE=PATH", help="an input artifact")
    stage.add_argument("--run-dir", help="default: runs/<kind>-alone")
    stage.add_argument("--force", action="store_true", help="re-run even if cached")
    stage.add_argument("--reuse-run-dir", action="store_true",
                       help="run into a run directory that holds another pipeline's run (refused otherwise)")
    stage.add_argument("overrides", nargs="*", metavar="key=value", default=[],
                       help="stage settings, or data./model. keys")
    stage.set_defaults(func=_cmd_stage)
    add_doctor_parser(sub, _console)
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

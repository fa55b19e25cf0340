"""``compress run | validate | schema | inspect | stage | join``: run, check, inspect or join a pipeline, or run one
stage of it alone.

Each command registers itself (``add_parsers``); the heavy imports are inside the commands, so
``compress --help`` stays fast."""
from __future__ import annotations

import argparse
import json

from pathlib import Path

from compress.commands.common import console, run_interruptible, gate_exit_code
from compress.errors import ConfigError


def _cmd_run(args: argparse.Namespace) -> int:
    from compress.pipeline.inspect_view import render
    from compress.pipeline.pipeline_file import load_pipeline
    from compress.pipeline.runner import RunOptions, Runner, default_run_dir

    pipeline = load_pipeline(args.pipeline, args.overrides)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(pipeline)
    options = RunOptions(only=args.only, from_stage=args.from_stage, force=set(args.force or []),
                         reuse_run_dir=args.reuse_run_dir)
    runner = Runner(pipeline, run_dir, console(), options)
    manifest = run_interruptible(runner, f"compress run {args.pipeline} --run-dir {run_dir}")
    render(run_dir, console(stderr=False))
    return gate_exit_code(manifest, runner.selected_names, run_dir)


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

    render(Path(args.run_dir), console(stderr=False))
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
    runner = Runner(pipeline, run_dir, console(), options)
    manifest = run_interruptible(runner, "the same compress stage command")
    render(run_dir, console(stderr=False))
    return gate_exit_code(manifest, runner.selected_names, run_dir)


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


def _cmd_join(args: argparse.Namespace) -> int:
    from compress.pipeline.console_log import to_console
    from compress.pipeline.distributed_launch import join_stage
    from compress.pipeline.pipeline_file import load_pipeline
    from compress.pipeline.runner import default_run_dir
    from compress.pipeline.pipeline_data import load_section

    pipeline = load_pipeline(args.pipeline, args.overrides)
    pipeline.stage(args.stage)  # a stage of this pipeline, or a clear error
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(pipeline)
    with to_console(console()):
        join_stage(run_dir, args.stage, args.node_rank, args.wait, lambda: load_section(pipeline.config.data, pipeline.source))
    return 0


def add_parsers(sub) -> None:
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

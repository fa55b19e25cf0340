"""The quantize stage's INT8 files that a runtime makes itself from the torch model (PyTorch's PT2E for Inductor),
beside the ONNX ladder's: one output ``native_<runtime>`` each, judged against the same red line on validation and
test through the runtime that runs it, and refused by the gate where it is over.

There is no ladder here: these files are made once, by post-training quantization, the way the runtime's own
documentation makes them. A file over the red line still ships to the bench, where it is measured and refused.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from compress.errors import StageError
from compress.stages.base import InputArtifact, Output
from compress.stages.int8_records import split_scorer
from compress.stages.quantize_record import RedLineCheck
from compress.stages.runtime_choice import bench_plan
from serve_bench.runners import RUNNERS, RunnerError, runtime_title


def native_runtimes() -> list[str]:
    """The runtimes that make an INT8 file of their own from a torch model."""
    return [name for name, runner in RUNNERS.items() if runner.native_int8_kind]


def output_name(runtime: str) -> str:
    return f"native_{runtime}"


def native_check(runtimes: list[str], stages: list[dict]) -> dict[str, dict]:
    """How each runtime's own INT8 file is judged: as the pipeline's last bench runs it (its settings for that
    runtime, the file's plain way of running, its threads), so the check covers what the bench may release. Part of
    the quantize stage's cache key."""
    plan = bench_plan(stages)
    out = {}
    for runtime in runtimes:
        runner = RUNNERS[runtime]
        options = runner.variants(runner.formats[runner.native_int8_kind], plan.get(runtime) or {})[0][1]
        out[runtime] = {"options": options, "threads": plan["threads"]}
    return out


def make_native_files(ctx, runtimes: list[str], model, description: dict, source: InputArtifact,
                      calib: np.ndarray, reference: dict[str, dict], red, field: str) -> tuple[list[Output], dict]:
    """Each runtime's INT8 file of ``model`` and what its red-line check found (``reference``: split → accuracy),
    judged as the bench runs it (``native_check``)."""
    check = native_check(runtimes, ctx.pipeline.stages)
    outputs, records = [], {}
    for runtime in runtimes:
        runner = RUNNERS[runtime]
        reason = runner.unavailable("cpu")
        if reason:
            raise StageError(f"{field}.native: {runtime} cannot make its INT8 file here ({reason})")
        name = output_name(runtime)
        title = runtime_title(runtime)
        ctx.log(f"{name}: {title}'s own INT8 file from {source.name} ({len(calib)} calibration images)")
        with ctx.atomic_output_dir(name) as folder:
            try:
                recipe = runner.make_native_int8(model, description, calib, folder)
                batch = ctx.pipeline.latency.batch_size if runner.answers_depend_on_batch else 64  # as the bench does
                scores = {split: split_scorer(ctx.data, split)(folder, batch, runtime=runtime, **check[runtime])
                          for split in ("val", "test")}
            except RunnerError as exc:
                raise StageError(f"stage {ctx.name!r}: {title} could not make or run its INT8 file: {exc}") from exc
        metric = red.metric
        drops = {split: round(reference[split][metric] - scores[split][metric], 4) for split in scores}
        within = all(d <= red.max_drop for d in drops.values()) if ctx.data.meaningful_accuracy else None
        record: dict[str, Any] = {"runtime": runtime, "recipe": recipe, "val": scores["val"][metric],
                                  "test": scores["test"][metric], "val_drop": drops["val"],
                                  "test_drop": drops["test"], "within": within, "judged_with": check[runtime]}
        verdict = {True: "within the red line", False: "OVER the red line", None: "red line not judged"}[within]
        ctx.log(f"{name}: test {metric} {scores['test'][metric]:.2f} (drop {drops['test']:+.2f}), val drop "
                f"{drops['val']:+.2f} — {verdict}", style="red" if within is False else None)
        meta = {"precision": "int8", "runtimes": [runtime], "source_model": source.name,
                "preprocessing": description["preprocessing"], "num_classes": description["architecture"]["num_classes"],
                "params": source.meta.get("params"), "macs": source.meta.get("macs"),
                "quantization": {"rung": "ptq", "made_by": recipe.get("quantizer"), "runtime": runtime},
                "test": scores["test"],
                "red_line": RedLineCheck(within=within, test_drop={runtime: drops["test"]}).model_dump()}
        outputs.append(Output(name, runner.native_int8_kind, ctx.stage_dir / name, made_from=[source.name], meta=meta))
        records[name] = record
    return outputs, records

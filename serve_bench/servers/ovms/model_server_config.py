"""An OpenVINO Model Server ``config.json`` for a released file, and its check.

OVMS reads one model from ``base_path``, whose numbered subfolders are its versions (``<name>/1/model.xml``
or ``model.onnx``); ``base_path`` may be relative to the config file. ``plugin_config`` is the OpenVINO CPU
plugin's own settings: here the measured threads (``INFERENCE_NUM_THREADS``), one stream per measured model
copy and the latency hint the bench's OpenVINO runner compiles with; ``nireq`` (parallel inference requests)
is the copies too. OVMS has no server-side batcher that waits for requests to join: each request runs as it
came, so a measured batch size does not carry over, and the release notes say so.

The check validates against OVMS's model-configuration schema as its source states it (``src/schema.cpp``:
``model_config_list`` of ``{"config": {...}}``, ``name`` and ``base_path`` required, no other keys than it
names), with ``jsonschema``, and checks that ``base_path`` holds a version folder with the served file. OVMS
itself is not on the package index, so the schema is restated here, limited to the model entries this project
writes.
"""
from __future__ import annotations

import json
from pathlib import Path

from serve_bench.servers.tensors import ServedFileError

CONFIG_FILE = "config.json"

MODEL_CONFIG_SCHEMA = {
    "type": "object",
    "required": ["model_config_list"],
    "additionalProperties": False,
    "properties": {
        "model_config_list": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["config"], "additionalProperties": False,
            "properties": {"config": {
                "type": "object", "required": ["name", "base_path"], "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "base_path": {"type": "string", "minLength": 1},
                    "batch_size": {"type": ["integer", "string"], "minimum": 0},
                    "model_version_policy": {"type": "object"},
                    "shape": {"type": ["object", "string"]},
                    "nireq": {"type": "integer", "minimum": 0},
                    "target_device": {"type": "string"},
                    "plugin_config": {"type": "object"},
                    "stateful": {"type": "boolean"},
                    "idle_sequence_cleanup": {"type": "boolean"},
                    "low_latency_transformation": {"type": "boolean"},
                    "max_sequence_number": {"type": "integer", "minimum": 0},
                }}}}},
        "pipeline_config_list": {"type": "array"},
        "custom_loader_config_list": {"type": "array"},
        "custom_node_library_config_list": {"type": "array"},
        "mediapipe_config_list": {"type": "array"},
    },
}
MODEL_FILES = ("model.xml", "model.onnx")  # what OVMS loads from a version folder, IR first


def model_server_config(name: str, base_path: str, *, instances: int, threads: int | None) -> dict:
    """One model's entry: the measured threads and copies as the CPU plugin's settings."""
    plugin = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": instances}
    if threads is not None:
        plugin["INFERENCE_NUM_THREADS"] = threads
    return {"model_config_list": [{"config": {"name": name, "base_path": base_path, "target_device": "CPU",
                                              "nireq": instances, "plugin_config": plugin}}]}


def check_config(path: Path) -> list[str]:
    """What would stop OVMS serving ``path``'s models: the schema, then each ``base_path``'s version folders."""
    import jsonschema

    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"{path}: not readable JSON ({exc})"]
    try:
        jsonschema.validate(document, MODEL_CONFIG_SCHEMA)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        return [f"{path}: not an OpenVINO Model Server configuration at {where}: {exc.message}"]
    problems = []
    for entry in document["model_config_list"]:
        config = entry["config"]
        base = (path.parent / config["base_path"]).resolve()
        if not base.is_relative_to(path.parent.resolve()):
            problems.append(f"{path}: model {config['name']!r} base_path {config['base_path']!r} leaves the "
                            "configuration's folder")
            continue
        versions = [v for v in base.iterdir() if v.is_dir() and v.name.isdigit()] if base.is_dir() else []
        if not versions:
            problems.append(f"{path}: model {config['name']!r}: {base} has no numbered version folder")
        for version in versions:
            if not any((version / f).is_file() for f in MODEL_FILES):
                problems.append(f"{path}: model {config['name']!r}: {version} holds none of {', '.join(MODEL_FILES)}")
    return problems


def write_config(path: Path, document: dict) -> None:
    problems = None
    path.write_text(json.dumps(document, indent=2) + "\n")
    problems = check_config(path)
    if problems:
        raise ServedFileError("; ".join(problems))

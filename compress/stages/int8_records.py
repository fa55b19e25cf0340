"""What the quantize stage records: the arrays it judges on, each rung's record, the shipped files' metadata."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch

from compress.errors import ArtifactError
from compress.quantization import measure as int8_measure
from compress.quantization.flavours import OPENVINO, TRT
from compress.quantization.ladder import Attempt
from compress.quantization.task_int8 import INT8
from compress.stages.base import InputArtifact
from compress.stages.model_source import model_from_artifact
from compress.stages.quantize_record import RedLineCheck
from export.external_data import UnsafeModelError, check_external_data
from train.data import BatchStream, DataBundle
from train.tasks import task_of


def split_arrays(data: DataBundle, name: str, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    split = getattr(data, name)
    n = len(split) if limit is None else min(limit, len(split))
    x, y = next(BatchStream(split, data, max(n, 1), shuffle=False, drop_last=False).epoch(0))
    return x[:n].numpy(), y[:n].numpy()


def torch_accuracy(model: torch.nn.Module, data: DataBundle, split: str) -> dict:
    """The float reference, measured the way every train stage measures: the task's evaluate loop (a detector's:
    decode, NMS and COCO mAP; a segmenter's: mIoU)."""
    stream = BatchStream(getattr(data, split), data, 256, shuffle=False, drop_last=False)
    return task_of(data).evaluate(model.cpu(), stream)


def split_scorer(data: DataBundle, split: str):
    """``score(path, batch_size, runtime=, threads=, options=)`` of an ONNX file on ``split``: top-k accuracy of
    a classifier's logits, a detector's mAP after NMS, a segmenter's mIoU."""
    images, labels = split_arrays(data, split)
    return INT8[task_of(data).name].scorer(data, images, labels)


def input_onnx(artifact: InputArtifact) -> Path:
    """The ONNX file of an input artifact (a folder holding it, or the file), its external data checked first."""
    path = artifact.path / artifact.meta.get("file", "model.onnx") if artifact.path.is_dir() else artifact.path
    try:
        check_external_data(path)
    except UnsafeModelError as exc:
        raise ArtifactError(f"input {artifact.name}: {exc}") from exc
    return path


def reference_accuracy(artifact: InputArtifact, data: DataBundle, split: str, model: torch.nn.Module | None) -> dict:
    """A red line's reference on ``split``: the torch model through the evaluate loop, an ONNX file (a brought
    model.onnx) through onnxruntime, as the bench measures it. ``model``: the artifact already loaded."""
    if artifact.kind == "onnx":
        return split_scorer(data, split)(input_onnx(artifact))
    if model is None:
        model = model_from_artifact(artifact, data)[0]
    return torch_accuracy(model, data, split)


def _compact(record: dict) -> dict:
    """A rung as the benchmark report shows it: accuracy and drop per flavour, float layers, first latency."""
    out = {"rung": record["rung"], "within_red_line": record["within_red_line"],
           "float_layers": len(record["float_layers"]), "flavours": {**record["flavours"], **record.get("runtimes", {})}}
    if "latency" in record:
        out["latency"] = {k: v for k, v in record["latency"].items() if k.endswith("_ms")}
    return out


def rung_records(attempts: list[Attempt], lints: dict, float_onnx: Path, val_x: np.ndarray,
                 metric: str) -> list[dict]:
    """Each rung's record, with its lint result and a first batch-1 latency of its CPU file vs the fp32 ONNX."""
    files = {a.rung: a.files["cpu"] for a in attempts if "cpu" in a.files}
    latency = int8_measure.quick_latency({"fp32": float_onnx, **files}, val_x[:64]) if files else {}
    records = []
    for attempt in attempts:
        record = attempt.record(metric)
        if attempt.rung in lints:
            record["tensorrt_lint"] = lints[attempt.rung]
        if attempt.rung in latency:
            fp32, int8 = latency["fp32"], latency[attempt.rung]
            record["latency"] = {"fp32_p50_ms": fp32["p50_ms"], "fp32_p99_ms": fp32["p99_ms"],
                                 "int8_p50_ms": int8["p50_ms"], "int8_p99_ms": int8["p99_ms"], "batch_size": 1,
                                 "note": "in-stage first look (short); the bench stage measures for the gate"}
        records.append(record)
    return records


def onnx_meta(flavour: str, chosen: Attempt, source: InputArtifact, description: dict, summary: dict,
              test: dict, runtimes: list[str], check: RedLineCheck) -> dict:
    """The manifest metadata of one shipped Q/DQ file: what it is, where it came from, how it was chosen, the
    runtimes it ships on (the bench measures it there only; none for the TensorRT file, which feeds an engine) and
    its red-line check on each (``check``, which the bench reads back as the same record)."""
    graph = onnx.load(str(chosen.files[flavour]), load_external_data=False).graph
    nncf = chosen.details.get("nncf") or {}
    return {"file": "model.onnx", "files": ["model.onnx"], "precision": "int8", "flavour": flavour,
            **({"runtimes": runtimes} if runtimes else {}),
            "qdq": {"cpu": f"uint8 activations, int8 per-channel weights ({summary['cpu_weights']})",
                    TRT.name: "symmetric int8 activations and per-channel weights, zero-point 0",
                    OPENVINO.name: (f"NNCF {nncf.get('preset', '?')} preset ({nncf.get('model_type', '?')}), laid out "
                                 "for OpenVINO" if nncf else "symmetric int8 from QAT, read by OpenVINO")}[flavour],
            "input_name": graph.input[0].name, "output_name": graph.output[0].name, "dynamic_batch": True,
            "preprocessing": description["preprocessing"], "num_classes": description["architecture"]["num_classes"],
            "params": source.meta.get("params"), "macs": source.meta.get("macs"), "source_model": source.name,
            "quantization": {"rung": chosen.rung, "flavour": flavour, "float_layers": chosen.float_layers,
                             "climbed": summary["climbed"], "rungs": [_compact(r) for r in summary["rungs"]]},
            "test": test,
            "red_line": check.model_dump(),
            "flags": summary["flags"]}

"""INT8 of a detector: which nodes form its decode tail (kept in float), and a file's mAP as a runtime runs it.

A detector's ONNX file ends in the decode: softplus distances times the stride around each cell
centre for the boxes, sigmoid for the scores, and one concatenation of both. Quantized with the rest,
that concatenation gets one per-tensor scale for coordinates (0..size pixels) and probabilities
(0..1), so every score rounds to 0 or to a step of ~size/255 and the mAP collapses (NNCF's YOLOv8
example and onnxruntime's maintainers reach the same fix: everything after the head convolutions
stays float). The tail is found from the graph, not by node names, as every node downstream of the
two head convolutions, so it holds for any exporter's naming.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from compress.quantization import measure as int8_measure
from train.detection.coco_map import match, mean_ap
from train.detection.postprocess import NmsSettings, detections


def head_conv_nodes(model: onnx.ModelProto, head_convs: tuple[str, ...]) -> list[str]:
    """The Conv nodes whose weight is ``<head>.weight`` for each head module name."""
    wanted = {f"{h}.weight" for h in head_convs}
    found = [n.name for n in model.graph.node if n.op_type == "Conv" and len(n.input) > 1
             and any(n.input[1] == w or n.input[1].endswith("." + w) or n.input[1].endswith(w) for w in wanted)]
    if len(found) != len(head_convs):
        raise ValueError(f"found {len(found)} head convolutions for {list(head_convs)} in the ONNX graph; the decode "
                         "tail cannot be located")
    return found


def tail_nodes(path: Path, head_convs: tuple[str, ...]) -> list[str]:
    """Every node downstream of the head convolutions (the decode), in graph order."""
    model = onnx.load(str(path), load_external_data=False)
    heads = set(head_conv_nodes(model, head_convs))
    tainted = {o for n in model.graph.node if n.name in heads for o in n.output}
    tail = []
    for node in model.graph.node:  # ONNX graphs are topologically sorted
        if node.name not in heads and any(i in tainted for i in node.input):
            tail.append(node.name)
            tainted.update(node.output)
    return tail


def file_map(path: Path, images: np.ndarray, targets: list[dict], num_classes: int, batch_size: int = 64,
             runtime: str = "onnxruntime", threads: int | None = None, options: dict | None = None,
             nms: NmsSettings = NmsSettings()) -> dict:
    """mAP@0.5:0.95 and mAP@0.5 (points) of the file's decoded outputs after NMS, as ``runtime`` runs it."""
    decoded = int8_measure.logits(path, images, batch_size, threads=threads, runtime=runtime, options=options)
    return mean_ap(match(targets, detections(decoded, nms), num_classes))

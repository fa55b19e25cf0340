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


def detection_output_error(reference: np.ndarray, candidate: np.ndarray, score_threshold: float = 0.05) -> float:
    """How far a quantized detector's decoded outputs are from the float ones, for ranking layers: the class
    scores' squared error relative to their variance, plus the boxes' where the float file finds something
    (best score ≥ ``score_threshold``) relative to theirs. Pixel coordinates of empty background cells would
    otherwise outweigh every score by the image size squared."""
    ref_scores, cand_scores = reference[..., 4:], candidate[..., 4:]
    error = float(np.mean((ref_scores - cand_scores) ** 2) / max(float(np.var(ref_scores)), 1e-12))
    found = ref_scores.max(axis=-1) >= score_threshold
    if found.any():
        ref_boxes, cand_boxes = reference[..., :4][found], candidate[..., :4][found]
        error += float(np.mean((ref_boxes - cand_boxes) ** 2) / max(float(np.var(ref_boxes)), 1e-12))
    return error


def file_map(path: Path, images: np.ndarray, targets: list[dict], num_classes: int, batch_size: int = 64,
             runtime: str = "onnxruntime", threads: int | None = None, options: dict | None = None,
             nms: NmsSettings = NmsSettings()) -> dict:
    """mAP@0.5:0.95 and mAP@0.5 (points) of the file's decoded outputs after NMS, as ``runtime`` runs it."""
    decoded = int8_measure.logits(path, images, batch_size, threads=threads, runtime=runtime, options=options)
    return mean_ap(match(targets, detections(decoded, nms), num_classes))

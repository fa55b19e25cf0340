"""What the INT8 ladder needs from each task, registered by task name so the quantize stage never branches on it:
how a file is scored on a split through the runtime that ships it, how far a quantized file's outputs are from
the float ones (for ranking layers), whether its decode tail stays float, and why QAT is not built for it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from compress.quantization import measure as int8_measure
from compress.quantization.detection_int8 import detection_output_error, file_map
from train.segmentation.metric import confusions, scores


def file_miou(path: Path, images: np.ndarray, masks: np.ndarray, num_classes: int, ignore_index: int,
              batch_size: int = 64, runtime: str = int8_measure.ONNX_RUNTIME, threads: int | None = None,
              options: dict | None = None) -> dict:
    """mIoU and pixel accuracy (points) of a segmenter's file, its argmax masks as ``runtime`` answers them."""
    from serve_bench.runners import make_runner, predict

    with make_runner(runtime, path, threads=threads, **(options or {})) as runner:
        predicted = predict(runner, images, batch_size, "argmax")
    out = scores(confusions(predicted, masks, num_classes, ignore_index).sum(0))
    return {"miou": float(out["miou"]), "pixel_acc": float(out["pixel_acc"]), "n": len(masks)}


def _classifier(data, images: np.ndarray, labels: np.ndarray) -> Callable:
    return lambda path, batch=64, **kw: int8_measure.split_accuracy(path, images, labels, batch, **kw)


def _detector(data, images: np.ndarray, labels: np.ndarray) -> Callable:
    targets = data.boxes_of(torch.from_numpy(labels))
    return lambda path, batch=64, **kw: file_map(path, images, targets, data.num_classes, batch, nms=data.nms, **kw)


def _segmenter(data, images: np.ndarray, labels: np.ndarray) -> Callable:
    return lambda path, batch=64, **kw: file_miou(path, images, labels, data.num_classes, data.ignore_index, batch,
                                                  **kw)


@dataclass(frozen=True)
class TaskInt8:
    scorer: Callable  # (data, images, labels) -> score(path, batch=64, runtime=, threads=, options=) -> metrics
    output_error: Callable | None = None  # None: the logits' relative squared error
    decode_tail: bool = False  # every node after the head convolutions stays float (a detector's box decode)
    no_qat: str | None = None  # why the ladder stops before QAT for this task


INT8 = {
    "classification": TaskInt8(scorer=_classifier),
    "detection": TaskInt8(scorer=_detector, output_error=detection_output_error, decode_tail=True,
                          no_qat="QAT of a detector is not built yet"),
    "segmentation": TaskInt8(scorer=_segmenter, no_qat="QAT of a segmenter is not built yet"),
}

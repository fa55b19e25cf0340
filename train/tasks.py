"""A vision task as one object the stages ask: its data, its loss, its metric, how a runtime's answers are kept.

Classification, detection and segmentation share every stage (the loop, the splits and digests, the
INT8 ladder, export, the bench). What differs is said here once, so a stage never branches on a task's
name, and a new task is a module and a registration in ``TASKS``:

- ``load``: the data set names this task reads and how (the splits, digests and batch streams are shared);
- ``loss``: the training loss hook (None: the loop's cross-entropy on class labels);
- ``evaluate``: the validation and test figures of a torch model, ``val_metric`` the one a run maximises;
- ``metrics``: the red-line metrics it may be gated on;
- ``predict_as``: what a runtime's answers are reduced to before they leave its worker (a segmenter's
  logits are classes × pixels; their argmax is all the metric needs);
- ``labels_move_with_pixels``: the loop's shift and flip augmentation moves pixels only, which would
  misplace boxes and masks;
- ``pipeline_settings``: a top-level pipeline section every score of this task depends on (a detector's
  NMS): part of every stage's cache key and handed to the bench.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

from torch import nn

from train.data import DATASETS, BatchStream, DataBundle, DataSpec, load_data
from train.distributed import SINGLE, ProcessGroupInfo


def _classification_evaluate(model: nn.Module, stream: BatchStream, autocast=contextlib.nullcontext,
                             group: ProcessGroupInfo = SINGLE) -> dict:
    from train.evaluate import evaluate

    return evaluate(model, stream, autocast, group=group)


def _detection_load(spec: DataSpec) -> DataBundle:
    from train.detection.data import load_detection

    return load_detection(spec)


def _detection_loss(bundle: DataBundle, model: nn.Module, label_smoothing: float = 0.0):
    from train.detection.training import loss_hook

    return loss_hook(bundle, model)


def _detection_evaluate(model: nn.Module, stream: BatchStream, autocast=contextlib.nullcontext,
                        group: ProcessGroupInfo = SINGLE) -> dict:
    from train.detection.training import evaluate_detector

    return evaluate_detector(model, stream, autocast)


def _segmentation_load(spec: DataSpec) -> DataBundle:
    from train.segmentation.data import load_segmentation

    return load_segmentation(spec)


def _segmentation_loss(bundle: DataBundle, model: nn.Module, label_smoothing: float = 0.0):
    from train.segmentation.training import loss_hook

    return loss_hook(bundle, model, label_smoothing)


def _segmentation_evaluate(model: nn.Module, stream: BatchStream, autocast=contextlib.nullcontext,
                           group: ProcessGroupInfo = SINGLE) -> dict:
    from train.segmentation.training import evaluate_segmenter

    return evaluate_segmenter(model, stream, autocast, group)


def _headline_top1(m: dict) -> str:
    return f"test top1 {m['test_top1']:.2f}%"


def _headline_map(m: dict) -> str:
    return f"test mAP {m['test_map']:.2f} (mAP@0.5 {m['test_map50']:.2f})"


def _headline_miou(m: dict) -> str:
    return f"test mIoU {m['test_miou']:.2f} (pixel accuracy {m['test_pixel_acc']:.2f})"


@dataclass(frozen=True)
class Task:
    name: str
    datasets: tuple[str, ...]
    metrics: tuple[str, ...]
    figures: tuple[str, ...]  # the test figures a stage records (test_<figure>)
    val_metric: str
    load: Callable[[DataSpec], DataBundle]
    evaluate: Callable[..., dict]
    headline: Callable[[dict], str]
    loss: Callable[..., Callable] | None = None
    predict_as: str = "logits"
    labels_move_with_pixels: bool = False
    distributed: bool = True
    pipeline_settings: str | None = None
    distillation: str = "logits"  # how a teacher's knowledge is passed on (compress.distillation.task_kd)
    export_alone: bool = True  # the bench exports the baseline as it is (a detector's file is the export stage's)
    describe: str = ""

    def red_line_problem(self, data_name: str, metric: str) -> str | None:
        """Why a pipeline of this task cannot read ``data_name`` or be gated on ``metric``, or None."""
        if data_name not in self.datasets:
            owner = next((t.name for t in TASKS.values() if data_name in t.datasets), None)
            return (f"data.name {data_name} holds no {self.name} labels ({self.describe}); use one of "
                    f"{', '.join(self.datasets)}" + (f", or add task: {owner}" if owner else ""))
        if metric not in self.metrics:
            owner = next((t.name for t in TASKS.values() if metric in t.metrics), None)
            return (f"red_line.metric {metric} does not judge {self.name}: use {' or '.join(self.metrics)}"
                    + (f" (or add task: {owner})" if owner else ""))
        return None


TASKS: dict[str, Task] = {t.name: t for t in (
    Task(name="classification", datasets=DATASETS, metrics=("top1", "top5"), figures=("top1", "top5"),
         val_metric="top1", load=load_data, evaluate=_classification_evaluate, headline=_headline_top1,
         describe="one class per image"),
    Task(name="detection", datasets=("coco", "shapes"), metrics=("map", "map50"), figures=("map", "map50"),
         val_metric="map", load=_detection_load, evaluate=_detection_evaluate, headline=_headline_map,
         loss=_detection_loss, labels_move_with_pixels=True, distributed=False, pipeline_settings="nms",
         distillation="detection", export_alone=False,
         describe="boxes and classes from COCO-format data, judged by COCO mAP"),
    Task(name="segmentation", datasets=("masks", "voc", "coco_masks", "scenes"), metrics=("miou", "pixel_acc"),
         figures=("miou", "pixel_acc"), val_metric="miou", load=_segmentation_load, evaluate=_segmentation_evaluate,
         headline=_headline_miou, loss=_segmentation_loss, predict_as="argmax", labels_move_with_pixels=True,
         distributed=False,
         describe="a class per pixel from index masks, judged by mIoU"),
)}


def task_named(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"task {name!r} is not known; use one of {', '.join(TASKS)}")
    return TASKS[name]


def task_of(data: DataBundle) -> Task:
    """The task whose labels ``data`` holds."""
    return TASKS[getattr(data, "task", "classification")]

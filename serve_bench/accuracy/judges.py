"""Which judge scores a test set's answers, by the task the set belongs to: a registration per task instead of a
branch in the bench. A classifier's answers are judged by the bench itself (paired hits, Wilson and McNemar),
so only the tasks judged by the paired image bootstrap are here."""
from __future__ import annotations

from typing import Callable

import numpy as np

from serve_bench.accuracy.detection import detection_entries, thin_classes as thin_detection
from serve_bench.accuracy.segmentation import segmentation_entries, thin_classes as thin_segmentation


def _detection(names: list[str], outputs: dict[str, np.ndarray], test, baseline: str, metric: str,
               max_drop: float | None, nms: dict | None) -> dict[str, dict]:
    from train.detection.postprocess import NmsSettings

    return detection_entries(names, outputs, test.targets, test.num_classes, baseline, metric, max_drop,
                             NmsSettings(**(nms or {})))


def _segmentation(names: list[str], outputs: dict[str, np.ndarray], test, baseline: str, metric: str,
                  max_drop: float | None, nms: dict | None) -> dict[str, dict]:
    return segmentation_entries(names, outputs, test.labels, test.num_classes, test.ignore_index,
                                test.class_names or [str(i) for i in range(test.num_classes)], baseline, metric,
                                max_drop)


JUDGES: dict[str, Callable[..., dict[str, dict]]] = {"detection": _detection, "segmentation": _segmentation}
THIN: dict[str, Callable] = {
    "detection": lambda test, names: thin_detection(test.targets, names),
    "segmentation": lambda test, names: thin_segmentation(test.labels, names, test.ignore_index),
}


def thin_flag(test, class_names: list[str]) -> str | None:
    """The test set's flag for classes too rare for its intervals, where its task has one."""
    thin = THIN.get(test.task)
    return thin(test, class_names) if thin is not None else None

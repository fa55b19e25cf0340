"""One taxonomy: each library package marks its errors as bad input or a failed run; the stage
boundary turns that into the exit code in one place."""
from __future__ import annotations

import pytest

from compress.distillation.loss import DistillationMismatch
from compress.errors import StageError, StageInputError, from_library
from compress.pruning.channel_pruning import PruningError, PruningInputError
from compress.quantization.ptq import QuantizationError
from export.errors import ExportLibraryError
from export.external_data import UnsafeModelError
from export.onnx_export import ExportError
from export.tensorrt_engine import EngineMismatch
from serve_bench.errors import BenchError
from serve_bench.runners import RunnerError
from serve_bench.stats.summary import TooFewSamples
from serve_bench.latency.worker import WorkerError
from train.datasets import DataError
from train.errors import TrainError
from train.loop import NonFiniteLoss
from train.models import ModelError


@pytest.mark.parametrize("error, code", [
    (DataError("no images"), 2), (ModelError("no such model"), 2), (NonFiniteLoss("loss became nan"), 3),
    (UnsafeModelError("absolute path"), 2), (EngineMismatch("other GPU"), 2), (ExportError("exporter failed"), 3),
    (TooFewSamples("999 < 1000"), 2), (RunnerError("provider fell back"), 3), (WorkerError("worker died"), 3),
    (PruningInputError("no BatchNorm"), 2), (PruningError("target not reached"), 3),
    (QuantizationError("calibration failed"), 3), (DistillationMismatch("5 vs 10 classes"), 2),
    (KeyError("a bug"), 3),
])
def test_the_stage_boundary_maps_every_library_error_to_its_exit_code(error, code):
    mapped = from_library(error, "quantize", "quantize")
    assert mapped.exit_code == code and isinstance(mapped, StageInputError if code == 2 else StageError)
    assert "stage 'quantize' (quantize)" in str(mapped) and str(error) in str(mapped)


def test_each_engine_package_has_one_base_error():
    assert issubclass(DataError, TrainError) and issubclass(NonFiniteLoss, TrainError)
    assert issubclass(ModelError, TrainError)
    assert issubclass(ExportError, ExportLibraryError) and issubclass(EngineMismatch, ExportLibraryError)
    assert all(issubclass(e, BenchError) for e in (RunnerError, TooFewSamples, WorkerError))
    # None is a ValueError or RuntimeError any more: a caller's `except ValueError` can't swallow them by accident.
    assert not any(issubclass(e, (ValueError, RuntimeError)) for e in (DataError, ModelError, ExportError, RunnerError,
                                                                       TooFewSamples, PruningError, QuantizationError))

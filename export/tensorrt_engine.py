"""ONNX → serialized TensorRT engine with the TensorRT 10 Python API.

TensorRT is optional and imported only inside the functions that need it. An engine is
only valid for the TensorRT version and the GPU it was built on, so the build records
both and loading compares them before deserialising. After a build the engine inspector
says which layers really run in INT8 / FP16 / FP32: a Q/DQ placement that leaves a
convolution in float shows up here, not later as a slow layer nobody can explain.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import onnx

from export.errors import ExportLibraryError
from export.onnx_metadata import read_metadata
from train.atomic_io import atomic_write_bytes

FORMAT = "compress-trt-engine/1"  # the engine metadata's format, kept: engines built before read as they were
# The one name of TensorRT's engine as this project speaks of it: the manifest's kind of an engine folder, the
# format reports give it, the export stage's output and format (the runtime that runs it is named the same).
# "trt-engine" (kind), "engine" (format, output) and the quantize flavour "trt" before; read with a warning.
ENGINE_KIND = "tensorrt"
ENGINE_FILE, META_FILE, LOG_FILE = "model.engine", "engine.json", "build.log"
_COMPUTE_LAYERS = ("conv", "gemm", "matrixmultiply", "fullyconnected", "deconv")


class TensorRTUnavailable(ExportLibraryError):
    bad_input = True
    """TensorRT or a CUDA device is missing on this machine."""


class EngineBuildError(ExportLibraryError):
    """TensorRT could not parse the ONNX or build an engine; the message carries its log."""


class EngineMismatch(ExportLibraryError):
    bad_input = True
    """An engine was built for another TensorRT version or GPU."""


@dataclass
class BuildSettings:
    precision: str = "fp16"  # fp32 | fp16 | int8 (int8: explicit quantization from a Q/DQ ONNX)
    min_batch: int = 1
    opt_batch: int = 1
    max_batch: int = 32
    workspace_mb: int = 1024
    timing_cache: Path | None = None


def unavailable_reason() -> str | None:
    """Why an engine cannot be built here, or None when it can."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return "TensorRT is not installed (pip install 'compress[tensorrt]' on a machine with an NVIDIA GPU)"
    except Exception as exc:  # a broken install raises OSError/RuntimeError from its shared libraries
        return f"TensorRT failed to import: {type(exc).__name__}: {exc}"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device is visible (TensorRT builds engines on the GPU they will run on)"
    return None


def has_qdq(model: onnx.ModelProto) -> bool:
    return any(node.op_type in ("QuantizeLinear", "DequantizeLinear") for node in model.graph.node)


def current_platform() -> dict:
    import tensorrt as trt
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return {"tensorrt_version": trt.__version__, "gpu_name": torch.cuda.get_device_name(0),
            "compute_capability": f"{major}.{minor}"}


def check_compatible(recorded: dict, current: dict) -> None:
    """Refuse an engine built elsewhere: TensorRT engines are tied to the version and the GPU."""
    problems = []
    if recorded.get("tensorrt_version") != current.get("tensorrt_version"):
        problems.append(f"TensorRT {recorded.get('tensorrt_version')} (this machine has {current.get('tensorrt_version')})")
    if recorded.get("compute_capability") != current.get("compute_capability") or \
            recorded.get("gpu_name") != current.get("gpu_name"):
        problems.append(f"GPU {recorded.get('gpu_name')} sm_{recorded.get('compute_capability')} "
                        f"(this machine has {current.get('gpu_name')} sm_{current.get('compute_capability')})")
    if problems:
        raise EngineMismatch("the engine was built for " + " and ".join(problems) +
                             "; rebuild it on this machine (re-run the export stage)")


def layer_precisions(engine_information: str) -> dict:
    """Count layers per precision from the inspector's JSON (needs DETAILED profiling verbosity)."""
    info = json.loads(engine_information)
    counts: dict[str, int] = {}
    float_compute = []
    for layer in info.get("Layers", []):
        if not isinstance(layer, dict):
            counts["unknown"] = counts.get("unknown", 0) + 1
            continue
        tensors = layer.get("Inputs") or layer.get("Outputs") or [{}]
        text = str(tensors[0].get("Format/Datatype", "")).lower()
        precision = next((p for key, p in (("int8", "INT8"), ("fp8", "FP8"), ("bf16", "BF16"), ("fp16", "FP16"),
                                           ("half", "FP16"), ("fp32", "FP32"), ("float", "FP32")) if key in text),
                         "unknown")
        counts[precision] = counts.get(precision, 0) + 1
        kind = str(layer.get("LayerType", "")).lower()
        if precision not in ("INT8", "FP8") and any(k in kind for k in _COMPUTE_LAYERS):
            float_compute.append(layer.get("Name", "?"))
    return {"layers": counts, "float_compute_layers": float_compute}


def build_engine(onnx_path: str | Path, out_dir: str | Path, settings: BuildSettings, input_name: str,
                 input_chw: tuple[int, int, int]) -> dict:
    """Build ``out_dir/model.engine`` (+ engine.json, build.log); return the recorded metadata."""
    onnx_path, out_dir = Path(onnx_path), Path(out_dir)
    if settings.precision == "int8" and not has_qdq(onnx.load(str(onnx_path), load_external_data=False)):
        raise EngineBuildError(f"{onnx_path} has no QuantizeLinear/DequantizeLinear nodes; an INT8 engine is built "
                               "from the quantize stage's Q/DQ ONNX (explicit quantization), not from a float model")
    reason = unavailable_reason()
    if reason:
        raise TensorRTUnavailable(reason)
    import tensorrt as trt

    class CapturingLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.lines: list[str] = []

        def log(self, severity, msg) -> None:
            self.lines.append(f"[{severity.name}] {msg}")

    logger = CapturingLogger()
    start = time.perf_counter()
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: explicit batch is the only mode
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i).desc()) for i in range(parser.num_errors))
        raise EngineBuildError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_mb * 2**20)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if settings.precision in ("fp16", "int8"):
        config.set_flag(trt.BuilderFlag.FP16)  # int8: layers left in float by the Q/DQ placement may use fp16
    if settings.precision == "int8":
        config.set_flag(trt.BuilderFlag.INT8)
    profile = builder.create_optimization_profile()
    profile.set_shape(input_name, (settings.min_batch, *input_chw), (settings.opt_batch, *input_chw),
                      (settings.max_batch, *input_chw))
    config.add_optimization_profile(profile)
    cache_bytes = settings.timing_cache.read_bytes() if settings.timing_cache and settings.timing_cache.is_file() else b""
    config.set_timing_cache(config.create_timing_cache(cache_bytes), ignore_mismatch=False)

    serialized = builder.build_serialized_network(network, config)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / LOG_FILE).write_text("\n".join(logger.lines) + "\n")
    if serialized is None:
        tail = "\n".join(line for line in logger.lines if line.startswith(("[ERROR]", "[INTERNAL_ERROR]")))[-2000:]
        raise EngineBuildError(f"TensorRT failed to build an engine from {onnx_path}: {tail or 'see build.log'}")
    if settings.timing_cache is not None:
        atomic_write_bytes(settings.timing_cache, bytes(config.get_timing_cache().serialize()))
    (out_dir / ENGINE_FILE).write_bytes(bytes(serialized))

    engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
    inspector = engine.create_engine_inspector()
    precisions = layer_precisions(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    onnx_sha256 = hashlib.sha256(onnx_path.read_bytes()).hexdigest()
    meta = {"format": FORMAT, **current_platform(), "onnx": onnx_path.name, "onnx_sha256": onnx_sha256,
            "precision": settings.precision,
            "input_name": input_name, "profile": {"min": settings.min_batch, "opt": settings.opt_batch,
                                                  "max": settings.max_batch, "chw": list(input_chw)},
            "workspace_mb": settings.workspace_mb, "build_seconds": round(time.perf_counter() - start, 2),
            **precisions, "onnx_metadata": read_metadata(onnx_path)}  # what the ONNX said it was made for
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2))
    return meta


def load_engine(engine_dir: str | Path):
    """Deserialise an engine after checking it was built for this TensorRT and this GPU."""
    reason = unavailable_reason()
    if reason:
        raise TensorRTUnavailable(reason)
    import tensorrt as trt

    engine_dir = Path(engine_dir)
    meta = json.loads((engine_dir / META_FILE).read_text())
    check_compatible(meta, current_platform())
    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine((engine_dir / ENGINE_FILE).read_bytes())
    if engine is None:
        raise EngineMismatch(f"TensorRT could not deserialise {engine_dir / ENGINE_FILE}; rebuild it")
    return engine, meta

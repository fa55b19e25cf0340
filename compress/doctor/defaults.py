"""What the pipeline's defaults will choose on this machine, and why.

Several defaults are decided by the hardware at run time (``amp: auto``, the bench's runtimes and
threads, whether an engine is built); a user who reads them here first is not surprised by an fp32
training run on an EPYC or by a bench that measures each ONNX file twice. Each choice is asked of the
code that makes it (``train.precision.choose_amp``, ``serve_bench.runners``, the stage configs'
defaults), never re-derived, so this table and the run cannot disagree.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from compress.doctor.runtimes import OK, RuntimeRow

logger = logging.getLogger(__name__)


@dataclass
class Choice:
    setting: str
    choice: str
    why: str

    def as_dict(self) -> dict:
        return asdict(self)


def training_precision() -> list[Choice]:
    """``amp: auto`` (the training default) on the CPU, and on the GPU where one is visible."""
    import torch

    from compress.stages.training_run import TrainingSettings
    from train.precision import choose_amp

    mode = TrainingSettings.model_fields["amp"].default
    cpu = choose_amp(mode, torch.device("cpu"))
    out = [Choice(f"train amp: {mode} (CPU)", cpu.name, cpu.reason)]
    if torch.cuda.is_available():
        gpu = choose_amp(mode, torch.device("cuda"))
        out.append(Choice(f"train amp: {mode} (GPU)", gpu.name,
                          f"{gpu.reason}; device: {TrainingSettings.model_fields['device'].default} trains on the GPU"))
    return out


def onnx_runtimes(device: str, rows: dict[str, RuntimeRow]) -> tuple[dict[str, str | None], list[str], str]:
    """(runtime → None if usable else why, the usable ones in the bench's order, whose answer it is)."""
    from serve_bench.runners import runtime_status, usable_onnx_runtimes

    return runtime_status(device), usable_onnx_runtimes(device), "serve_bench.runners"


def bench_threads(machine: dict) -> int:
    """The bench's intra-op threads when a pipeline names none: the physical cores."""
    try:
        from serve_bench.runners import physical_cores
    except ImportError:
        return int(machine.get("physical_cores") or 1)
    return physical_cores()


def bench_choices(machine: dict, rows: dict[str, RuntimeRow], gpu: bool) -> list[Choice]:
    from export.tensorrt_engine import ENGINE_KIND
    from serve_bench.runners import RUNNER_OF_KIND

    status, usable, source = onnx_runtimes("cpu", rows)
    not_used = "; ".join(f"{name}: {why}" for name, why in status.items() if why)
    out = [Choice("bench runtimes for ONNX files (CPU)", ", ".join(usable) or "none",
                  (f"each ONNX file is measured on every runtime usable here, on the first under the file's own "
                   f"name, on the others as <file>@<runtime> ({source})" if usable
                   else f"no ONNX runtime runs here ({source})")
                  + (f"; not used: {not_used}" if not_used else ""))]
    if gpu:
        status, usable, source = onnx_runtimes("cuda", rows)
        out.append(Choice("bench runtimes for ONNX files (device: cuda)", ", ".join(usable) or "none",
                          "; ".join(f"{name}: {why}" for name, why in status.items() if why) or f"({source})"))
    threads = bench_threads(machine)
    out.append(Choice("bench threads", str(threads),
                      f"the physical cores ({machine.get('physical_cores')} physical, {machine.get('logical_cores')} "
                      "logical): hyper-threads share execution units and add little to inference"))
    engine = rows[RUNNER_OF_KIND[ENGINE_KIND]]  # the runtime of the export stage's engine file
    out.append(Choice("export: TensorRT engine", "built" if engine.status == OK else "skipped (recorded as skipped)",
                      engine.detail if engine.status != OK else "TensorRT and a CUDA device are here"))
    return out


def int8_flavour(machine: dict) -> Choice:
    """The quantize stage's CPU file: uint8 activations × int8 weights, 7-bit unless the pipeline says 8bit."""
    from compress.stages.quantize_stage import QuantizeConfig

    weights = QuantizeConfig.model_fields["cpu_weights"].default
    dot, vnni = machine.get("int8_dot_product"), machine.get("int8_dot_product_native")
    here = (f"VNNI is present here ({dot}): 8-bit weights would also compute exactly on this CPU; 7-bit keeps the "
            "file exact on CPUs without VNNI too" if vnni else
            f"VNNI is absent here ({dot}): onnxruntime multiplies with vpmaddubsw, whose 16-bit pair sums 8-bit "
            "weights can saturate (2·255·127 > 32,767); 7-bit weights cannot (2·255·64 = 32,640)")
    return Choice("quantize: CPU INT8 file", f"uint8 activations × int8 weights, cpu_weights: {weights}",
                  f"{here} (README: 'Why the CPU file has 7-bit weights')")


def default_choices(machine: dict, rows: dict[str, RuntimeRow], gpu: bool) -> list[Choice]:
    return [*training_precision(), *bench_choices(machine, rows, gpu), int8_flavour(machine)]

"""The INT8 files the quantize stage makes: one per runtime, each laid out the way that runtime fuses it.

What each flavour is for is said once, here; the runtimes are named by their runners, which own what a
runtime knows (serve_bench.runners). The ladder, the quantize stage and its records read this table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from compress.quantization.measure import ONNX_RUNTIME
from serve_bench.runners import OpenVinoRunner, TensorRTRunner


@dataclass(frozen=True)
class Flavour:
    name: str
    runtime: str  # the runtime the file is made for
    judged_on: str  # the runtime whose answers judge its red line here (TensorRT's file: onnxruntime, on the CPU)
    made_by: str  # "quantize_static" (onnxruntime's) or "nncf"
    ships: bool  # measured and released as a file of its own (the TensorRT file feeds an engine build instead)


# cpu: uint8 activations, the only layout onnxruntime's x86 convolutions fuse. tensorrt: symmetric int8, TensorRT's
# explicit quantization (a file named after the runtime it is made for, as the openvino one is; "trt" before). The OpenVINO file: NNCF places the quantizers where OpenVINO's transformations fuse them.
CPU = Flavour("cpu", ONNX_RUNTIME, ONNX_RUNTIME, "quantize_static", ships=True)
TRT = Flavour(TensorRTRunner.runtime, TensorRTRunner.runtime, ONNX_RUNTIME, "quantize_static", ships=False)
OPENVINO = Flavour(OpenVinoRunner.runtime, OpenVinoRunner.runtime, OpenVinoRunner.runtime, "nncf", ships=True)
FLAVOURS: dict[str, Flavour] = {f.name: f for f in (CPU, TRT, OPENVINO)}
FORMER_FLAVOUR_NAMES = {"trt": TRT.name}  # read from older pipeline files, with a warning


class Check(NamedTuple):
    """One red-line check: a flavour's file as one runtime answers it. The CPU file is checked on each runtime it may
    ship on; every other file on the runtime that judges it (``own``). Kept as a pair through the ladder and the
    quantize stage, so that no reader splits a joined name."""

    flavour: str
    runtime: str

    @classmethod
    def own(cls, flavour: str) -> "Check":
        return cls(flavour, FLAVOURS[flavour].judged_on)

    def __str__(self) -> str:  # how logs and records name it: the flavour alone where its own runtime judges it
        return self.flavour if self == Check.own(self.flavour) else f"{self.flavour}@{self.runtime}"


def ships_on(flavour: str, cpu_runtimes: list[str] | tuple[str, ...]) -> list[str]:
    """The runtimes a shipped file is measured and released on: the CPU file also on each runtime it was checked
    on (where no file of that runtime's own is made); none for the TensorRT file."""
    made = FLAVOURS[flavour]
    if not made.ships:
        return []
    return [made.runtime, *cpu_runtimes] if made is CPU else [made.runtime]

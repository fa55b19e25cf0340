"""The channel counts of a file's convolutions against the multiple its runtime's kernels want.

A pruned file's widths are whatever the channel ranking left (9, 15, 151, 433 …) unless the prune stage
rounded them. The x86 convolutions of onnxruntime and OpenVINO work on channel blocks, and a width off the
block pays for padding or falls to a slower path (measured per runtime and instruction set:
``pipelines/channel_multiples.py``; each runner's ``channel_multiple`` holds the result). Read from the file
itself, so the bench can say why a compressed file is slower than the unpruned one on the same runtime.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

SHOWN = 8  # widths named in a line


@dataclass
class ConvWidths:
    """Output widths of a file's convolutions (a depthwise one's width is its group count)."""

    widths: dict[str, int] = field(default_factory=dict)  # convolution node → output channels

    def off(self, multiple: int) -> dict[str, int]:
        return {name: w for name, w in self.widths.items() if w % multiple}

    def as_dict(self, multiple: int) -> dict:
        off = self.off(multiple)
        return {"convolutions": len(self.widths), "multiple": multiple, "off_multiple": len(off),
                "examples": sorted(set(off.values()))[:SHOWN]}


def _weight_shape(name: str, initializers: dict, producers: dict) -> tuple[int, ...] | None:
    """The shape of a convolution's weight: an initializer, or one behind a DequantizeLinear (a Q/DQ file)."""
    if name in initializers:
        return tuple(initializers[name].dims)
    node = producers.get(name)
    if node is not None and node.op_type == "DequantizeLinear" and node.input[0] in initializers:
        return tuple(initializers[node.input[0]].dims)
    return None


def widths_against(path: str | Path, unpruned: str | Path, runtime: str) -> dict | None:
    """The file's convolution widths against ``runtime``'s channel multiple on this CPU, beside the unpruned
    file's (``file``, ``unpruned``); None where the runner wants no multiple or either file has no widths."""
    from serve_bench.runners import RUNNERS
    from train.hardware import isa_facts

    multiple = RUNNERS[runtime].channel_blocks.get(isa_class(isa_facts()), 1)
    mine, theirs = conv_widths(str(path)), conv_widths(str(unpruned))
    if multiple <= 1 or mine is None or theirs is None:
        return None
    return {"file": mine.as_dict(multiple), "unpruned": theirs.as_dict(multiple)}


def conv_widths(path: str | Path) -> ConvWidths | None:
    """The output widths of the file's Conv and QLinearConv nodes; None where it is not an ONNX file one can read
    (a TensorRT engine, a torch model folder) or its weights are not constants."""
    path = Path(path)
    if path.suffix != ".onnx" or not path.is_file():
        return None
    stat = path.stat()
    return _read_widths(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=64)  # the unpruned file is the reference of every compressed file on its runtime: read once,
def _read_widths(path: str, mtime_ns: int, size: int) -> ConvWidths | None:  # again where the file changed
    del mtime_ns, size  # the cache's key only
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    found = ConvWidths()
    for node in graph.node:
        weight = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3}.get(node.op_type)
        if weight is None or len(node.input) <= weight:
            continue
        shape = _weight_shape(node.input[weight], initializers, producers)
        if shape:
            found.widths[node.name or node.output[0]] = int(shape[0])
    return found if found.widths else None


def width_words(widths: dict, runtime: str) -> str | None:
    """The line a flag gives: how many convolutions are off the runtime's channel multiple, with examples."""
    if not widths or not widths.get("off_multiple"):
        return None
    shown = ", ".join(str(w) for w in widths["examples"])
    return (f"{widths['off_multiple']} of its {widths['convolutions']} convolutions have channel counts that are not "
            f"a multiple of {widths['multiple']} ({shown} …), the block {runtime}'s convolutions work in on this CPU: "
            "prune with round_to at that multiple")


def isa_class(isa: dict) -> str:
    """The instruction-set class the kernels' channel blocks follow: ``avx512`` (16 floats a register, and AMX's
    tiles where present, under ``amx``), ``avx2`` (8), or ``other``."""
    if isa.get("amx_tile") and isa.get("avx512_f"):
        return "amx"
    if isa.get("avx512_f"):
        return "avx512"
    return "avx2" if isa.get("avx2") else "other"


def wanted_multiple(runtimes: list[str], isa: dict) -> tuple[int, str]:
    """The channel multiple that suits every runtime in ``runtimes`` on a CPU of ``isa`` (the least common
    multiple of each runner's measured ``channel_blocks``), and the reason in words."""
    from serve_bench.runners import RUNNERS, runtime_title

    kind = isa_class(isa)
    wants = {rt: RUNNERS[rt].channel_blocks.get(kind, 1) for rt in runtimes if rt in RUNNERS}
    multiple = math.lcm(*wants.values()) if wants else 1
    parts = [f"{runtime_title(rt)} {m}" for rt, m in wants.items()]
    return multiple, (f"the multiple the convolutions want on this CPU ({kind}), measured per runtime "
                      f"(pipelines/channel_multiples.py): {', '.join(parts) or 'no runtime'}")

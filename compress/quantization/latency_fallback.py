"""The ladder's latency counterpart: groups of layers whose INT8 costs more time than it saves, kept in float.

An INT8 file is only as fast as what its runtime makes of it. onnxruntime has no integer kernel for
hard-swish or hard-sigmoid, so a convolution feeding one pays a dequantize → float → quantize round trip
after its integer kernel, and a squeeze-excite block's tiny convolutions and multiply cost more in
conversions than they save. Which of these pay on which CPU is a measurement, not a rule: this module
tries it, greedily and within a bound, on the runtime the file ships on.

Groups come from the float graph (plain structure, no model-specific names): convolutions inside
squeeze-excite blocks (their input is a global pooling), depthwise convolutions, convolutions whose
output feeds a hard-swish or hard-sigmoid, and upsampling (``Resize``: a segmenter's decoder and its
logits brought to the input's size). onnxruntime drops the Q/DQ around a linear ``Resize`` and
interpolates in integers, with rounding the ONNX definition does not have (onnxruntime issues 21319 and
28448), and a quantized resize of the logits is a quantize-dequantize pair it cannot fuse: whether float
upsampling pays is measured like the rest. Each round makes one candidate file per remaining group (that
group kept float on top of what is already kept), times every candidate against the current file in one
interleaved run, and keeps the fastest candidate whose p50 ratio interval lies wholly below 1 and whose
accuracy stays within the red line. At most ``max_rounds`` rounds, so at most G + (G-1) + … files for G groups.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import onnx

logger = logging.getLogger(__name__)

POOLING = ("GlobalAveragePool", "ReduceMean")
HARD_ACTIVATIONS = ("HardSwish", "HardSigmoid")
UPSAMPLING = ("Resize", "Upsample")


def resize_nodes(path: Path) -> list[dict]:
    """Every ``Resize`` of a (quantized) file: its mode, and whether the runtime may run it on integers (``int8``:
    its input is dequantized and its output quantized with the same scale and zero point, the pattern
    onnxruntime folds into an integer resize) or runs it in ``float`` (no such pair: the node was excluded)."""
    from onnx import numpy_helper

    graph = onnx.load(str(path), load_external_data=False).graph
    producer = {out: n for n in graph.node for out in n.output}
    values = {t.name: numpy_helper.to_array(t).tolist() for t in graph.initializer}
    values.update({n.output[0]: numpy_helper.to_array(a.t).tolist() for n in graph.node if n.op_type == "Constant"
                   for a in n.attribute if a.name == "value"})
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def params(node: onnx.NodeProto) -> tuple:
        return tuple(repr(values.get(name, name)) for name in node.input[1:3])

    out = []
    for node in graph.node:
        if node.op_type not in UPSAMPLING:
            continue
        source = producer.get(node.input[0])
        after = [c for c in consumers.get(node.output[0], []) if c.op_type == "QuantizeLinear"]
        quantized = (source is not None and source.op_type == "DequantizeLinear"
                     and any(params(q) == params(source) for q in after))
        mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "nearest")
        out.append({"node": node.name, "mode": mode, "runs": "int8" if quantized else "float"})
    return out


@dataclass(frozen=True)
class LatencyFallbackSettings:
    enabled: bool = True
    max_rounds: int = 3  # greedy rounds; each makes and times one file per remaining group
    min_iters: int = 300  # timed requests per file per round (interleaved, batch 1)


def layer_groups(float_onnx: Path) -> dict[str, list[str]]:
    """Group name → the convolutions in it, for the groups this graph has (an empty group is left out)."""
    graph = onnx.load(str(float_onnx), load_external_data=False).graph
    producer = {out: n for n in graph.node for out in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    shapes = {t.name: t.dims for t in graph.initializer}

    def feeds_hard_activation(node: onnx.NodeProto) -> bool:
        # through an optional Add/Mul of the activation's own decomposition (x * hardsigmoid(x))
        return any(c.op_type in HARD_ACTIVATIONS for c in consumers.get(node.output[0], []))

    def depthwise(node: onnx.NodeProto) -> bool:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        weight = shapes.get(node.input[1])
        return group > 1 and weight is not None and len(weight) == 4 and weight[1] == 1

    def after(node: onnx.NodeProto) -> list[onnx.NodeProto]:
        return consumers.get(node.output[0], [])

    def excite(squeeze: onnx.NodeProto) -> str | None:
        """The excite conv of a squeeze conv: reached through its activation, and gating by a multiply
        (directly or through a sigmoid-like activation); a head conv after the global pooling has none."""
        for act in after(squeeze):
            for conv in (c for c in after(act) if c.op_type == "Conv"):
                if any(g.op_type == "Mul" or any(h.op_type == "Mul" for h in after(g)) for g in after(conv)):
                    return conv.name
        return None

    se, dw, hard = [], [], []
    # a nearest resize copies values, exact in INT8 and as fast: only interpolating ones are worth a try
    upsampling = [node.name for node in graph.node if node.op_type in UPSAMPLING
                  and next((a.s.decode() for a in node.attribute if a.name == "mode"), "nearest") != "nearest"]
    for node in graph.node:
        if node.op_type != "Conv":
            continue
        source = producer.get(node.input[0])
        gate = excite(node) if source is not None and source.op_type in POOLING else None
        if gate is not None:  # the squeeze (pooled channels into a small conv) and its excite conv
            se += [node.name, gate]
        elif depthwise(node):
            dw.append(node.name)
        if feeds_hard_activation(node) and node.name not in se:
            hard.append(node.name)
    groups = {"squeeze-excite": se, "depthwise": [n for n in dw if n not in hard],
              "before hard-swish/hard-sigmoid": hard, "upsampling (Resize)": upsampling}
    return {name: sorted(set(nodes)) for name, nodes in groups.items() if nodes}


@dataclass
class Trial:
    """One candidate of one round: a set of groups kept in float, its file and what it measured."""

    groups: tuple[str, ...]
    path: Path
    ratio: dict  # p50 against the current file: {"ratio", "ci", ...}
    drop: float | None  # accuracy points below the reference (None: not judged, it was not faster)
    within: bool | None

    def as_dict(self) -> dict:
        return {"float_groups": list(self.groups), "p50_ratio": self.ratio, "drop": self.drop,
                "within_red_line": self.within}


def greedy(groups: dict[str, list[str]], make: Callable[[list[str], str], Path],
           time_against: Callable[[Path, dict[str, Path]], dict[str, dict]], judge: Callable[[Path], float],
           current: Path, max_drop: float, settings: LatencyFallbackSettings,
           log: Callable[[str], None] = logger.info) -> dict:
    """Keep the groups whose float version is measurably faster, within the red line.

    ``make(nodes, tag)`` writes a file with ``nodes`` kept in float; ``time_against(current, candidates)`` times
    them in one interleaved run and returns each candidate's p50 ratio to ``current`` with its interval;
    ``judge(path)`` returns its accuracy drop. Returns the record: what was kept float and why, every trial,
    the file chosen and the time it took.
    """
    start = time.perf_counter()
    kept: list[str] = []
    rounds: list[list[dict]] = []
    for round_no in range(settings.max_rounds):
        left = [g for g in groups if g not in kept]
        if not left:
            break
        candidates = {g: make([n for k in (*kept, g) for n in groups[k]], f"latency-{round_no}-{i}")
                      for i, g in enumerate(left)}
        ratios = time_against(current, candidates)
        trials = []
        for g in left:
            ratio = ratios[g]
            faster = ratio["ci"][1] < 1.0
            drop = judge(candidates[g]) if faster else None
            trials.append(Trial((*kept, g), candidates[g], ratio, drop, None if drop is None else drop <= max_drop))
        rounds.append([t.as_dict() for t in trials])
        winners = [t for t in trials if t.within]
        log(f"latency fallback, round {round_no + 1}: " + "; ".join(
            f"{t.groups[-1]} float: p50 ×{t.ratio['ratio']:.2f} [{t.ratio['ci'][0]:.2f}, {t.ratio['ci'][1]:.2f}]"
            + ("" if t.drop is None else f", drop {t.drop:+.2f}") for t in trials))
        if not winners:
            break
        best = min(winners, key=lambda t: t.ratio["ratio"])
        kept.append(best.groups[-1])
        current = best.path
    return {"groups": {g: len(nodes) for g, nodes in groups.items()}, "kept_float": kept,
            "float_nodes": [n for g in kept for n in groups[g]], "rounds": rounds, "file": current,
            "seconds": round(time.perf_counter() - start, 1), "max_rounds": settings.max_rounds,
            "rule": "a group stays float when its file's p50 ratio to the current file has a 95% interval below 1 "
                    "and its accuracy is within the red line; the fastest such group per round"}

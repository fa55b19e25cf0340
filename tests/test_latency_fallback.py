"""The latency-aware float fallback: which layer groups a graph has, and the greedy rule on scripted timings."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from compress.quantization.flavours import Check
from compress.quantization.latency_fallback import LatencyFallbackSettings, greedy, layer_groups
from export.onnx_export import export_onnx


class _MobileBlock(nn.Module):
    """MobileNetV3's shape in miniature: a depthwise conv into ReLU, one into hard-swish, a squeeze-excite
    block (pool, 1×1 conv, ReLU, 1×1 conv, hard-sigmoid, multiply), a pointwise projection."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.dw_relu = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.dw_hswish = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.reduce, self.expand = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 8, 1)
        self.project = nn.Conv2d(8, 16, 1)
        self.conv_head = nn.Conv2d(16, 16, 1)  # MobileNetV3's head: a conv after the global pooling, no gate

    def forward(self, x):
        y = torch.relu(self.dw_relu(self.stem(x)))
        y = nn.functional.hardswish(self.dw_hswish(y))
        gate = nn.functional.hardsigmoid(self.expand(torch.relu(self.reduce(y.mean((2, 3), keepdim=True)))))
        pooled = self.project(y * gate).mean((2, 3), keepdim=True)
        return nn.functional.hardswish(self.conv_head(pooled)).flatten(1)


def test_the_groups_are_found_from_the_graph_structure(tmp_path):
    export_onnx(_MobileBlock().eval(), torch.randn(2, 3, 8, 8), tmp_path / "m.onnx")
    groups = layer_groups(tmp_path / "m.onnx")
    assert set(groups) == {"squeeze-excite", "depthwise", "before hard-swish/hard-sigmoid"}
    assert len(groups["squeeze-excite"]) == 2 and len(groups["depthwise"]) == 1
    # the hard-swish depthwise and the head conv (pooled input, but no gate: not a squeeze); the SE conv is in SE
    assert len(groups["before hard-swish/hard-sigmoid"]) == 2
    assert not any("conv_head" in n for n in groups["squeeze-excite"])
    assert not set(groups["depthwise"]) & set(groups["before hard-swish/hard-sigmoid"])


def _ratio(value: float, half: float = 0.03) -> dict:
    return {"ratio": value, "ci": [value - half, value + half]}


def _scripted(ratios: dict[tuple[str, ...], float], drops: dict[tuple[str, ...], float]):
    """make/time/judge stand-ins: a file is named by the groups it keeps float; its p50 over the current file
    and its drop are read from the scripts (a machine whose answers are known)."""
    groups = {"se": ["a", "b"], "dw": ["c"], "hard": ["d", "e"]}
    owner = {n: g for g, nodes in groups.items() for n in nodes}
    made: list[tuple[str, ...]] = []

    def make(nodes: list[str], tag: str) -> Path:
        key = tuple(dict.fromkeys(owner[n] for n in nodes))
        made.append(key)
        return Path("/".join(key))

    def time_against(current: Path, files: dict[str, Path]) -> dict[str, dict]:
        return {g: _ratio(ratios[tuple(str(p).split("/"))]) for g, p in files.items()}

    def judge(path: Path) -> float:
        return drops.get(tuple(str(path).split("/")), 0.0)

    return groups, make, time_against, judge, made


def test_greedy_keeps_the_fastest_group_per_round_and_stops_when_none_is_faster():
    ratios = {("se",): 0.80, ("dw",): 1.02, ("hard",): 0.90,  # round 1: se wins
              ("se", "dw"): 1.05, ("se", "hard"): 0.95}      # round 2: hard wins; round 3: dw is slower
    ratios[("se", "hard", "dw")] = 1.01
    groups, make, time_against, judge, made = _scripted(ratios, {})
    record = greedy(groups, make, time_against, judge, Path("int8"), 0.5, LatencyFallbackSettings(max_rounds=5))
    assert record["kept_float"] == ["se", "hard"] and record["float_nodes"] == ["a", "b", "d", "e"]
    assert record["file"] == Path("se/hard") and len(record["rounds"]) == 3 and len(made) == 3 + 2 + 1


def test_a_faster_group_past_the_red_line_is_not_kept_and_an_overlapping_interval_is_not_faster():
    ratios = {("se",): 0.80, ("dw",): 0.99, ("hard",): 0.90, ("hard", "se"): 0.70, ("hard", "dw"): 0.95,
              ("hard", "dw", "se"): 0.90}
    groups, make, time_against, judge, _ = _scripted(ratios, {("se",): 2.0, ("hard", "se"): 2.0, ("hard", "dw", "se"): 2.0})
    record = greedy(groups, make, time_against, judge, Path("int8"), 0.5, LatencyFallbackSettings(max_rounds=5))
    # se is faster but loses 2 points; dw's interval [0.96, 1.02] holds 1; round 2: dw [0.92, 0.98] is faster
    assert record["kept_float"] == ["hard", "dw"]
    first = {t["float_groups"][-1]: t for t in record["rounds"][0]}
    assert first["se"]["within_red_line"] is False and first["dw"]["drop"] is None  # not faster: not judged


def test_the_rounds_are_bounded():
    ratios = {("se",): 0.8, ("dw",): 0.9, ("hard",): 0.95, ("se", "dw"): 0.9, ("se", "hard"): 0.9}
    groups, make, time_against, judge, made = _scripted(ratios, {})
    record = greedy(groups, make, time_against, judge, Path("int8"), 0.5, LatencyFallbackSettings(max_rounds=1))
    assert record["kept_float"] == ["se"] and len(made) == 3 and record["max_rounds"] == 1


def test_the_ladder_ships_the_faster_cpu_file_with_its_groups_float_and_its_new_accuracy(tmp_path, monkeypatch):
    import numpy as np
    import onnx

    from compress.quantization import ladder as int8_ladder, measure as int8_measure
    from compress.quantization.ladder import Ladder, LadderSettings, latency_fallback
    from compress.quantization.ptq import Calibration

    export_onnx(_MobileBlock().eval(), torch.randn(2, 3, 8, 8), tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    images = rng.standard_normal((32, 3, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 16, 32)
    settings = LadderSettings(flavours=("cpu",), calibration=Calibration(method="minmax"), max_drop=100.0)
    ladder = Ladder(tmp_path / "m.onnx", tmp_path / "work", settings, images[:16], images, labels, 50.0)
    chosen = ladder.ptq()
    groups = layer_groups(tmp_path / "m.onnx")

    confirmed = {"final": 0.85}

    def scripted(current, files, pool, **_):  # keeping the squeeze-excite block float is the only measurable gain
        return {g: _ratio(confirmed[g] if g == "final" else 0.8 if g == "squeeze-excite" else 1.0) for g in files}

    monkeypatch.setattr(int8_measure, "p50_ratios", scripted)
    ladder_file = chosen.files["cpu"]
    confirmed["final"] = 1.0  # a fresh run does not confirm the gain: the ladder's file stays
    record = latency_fallback(ladder, chosen, int8_ladder.LatencyFallbackSettings(max_rounds=2))
    assert record["kept_float"] == [] and record["confirmed"]["ratio"] == 1.0 and chosen.files["cpu"] == ladder_file
    confirmed["final"] = 0.85
    record = latency_fallback(ladder, chosen, int8_ladder.LatencyFallbackSettings(max_rounds=2))
    assert record["kept_float"] == ["squeeze-excite"] and chosen.details["latency_fallback"] is record
    graph = onnx.load(str(chosen.files["cpu"])).graph
    producers = {o: n.op_type for n in graph.node for o in n.output}
    float_convs = {n.name for n in graph.node if n.op_type == "Conv" and producers.get(n.input[1]) != "DequantizeLinear"}
    assert float_convs == set(groups["squeeze-excite"])  # exactly the group, as its record names it
    cpu = Check.own("cpu")
    assert chosen.drops[cpu] == 50.0 - chosen.val[cpu]["top1"]  # judged again: the shipped file's own accuracy


def test_a_segmenters_upsampling_is_a_group_and_the_record_says_how_each_resize_runs(tmp_path):
    from compress.quantization.latency_fallback import resize_nodes
    from compress.quantization.ptq import Calibration, quantize
    from train.models import build_model

    model = build_model("tiny_segmenter", 3, 3, {"width": 8}).eval()
    export_onnx(model, torch.randn(1, 3, 32, 32), tmp_path / "m.onnx")
    groups = layer_groups(tmp_path / "m.onnx")
    assert len(groups["upsampling (Resize)"]) == 2  # the decoder's and the logits' to the input size
    calib = torch.randn(8, 3, 32, 32).numpy()
    both = quantize(tmp_path / "m.onnx", tmp_path / "q.onnx", "cpu", Calibration(method="minmax"), calib,
                    tmp_path / "cache")
    assert [r["runs"] for r in resize_nodes(both)] == ["int8", "int8"]
    kept = quantize(tmp_path / "m.onnx", tmp_path / "f.onnx", "cpu", Calibration(method="minmax"), calib,
                    tmp_path / "cache", exclude=groups["upsampling (Resize)"])
    assert {r["runs"] for r in resize_nodes(kept)} == {"float"} and {r["mode"] for r in resize_nodes(kept)} == {"linear"}

"""The model servers' files of a release: a Triton model repository and an OpenVINO Model Server config, written
from the measured serving settings, parsed with the servers' own schemas and checked against the file."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from serve_bench.report_model import Entry
from serve_bench.servers.deployment import (ServedSettings, check_server_files, queue_limit, served_settings,
                                            write_server_files)
from serve_bench.servers.tensors import ServedFileError, onnx_tensors
from serve_bench.servers.triton.model_repository import parse_config

SETTINGS = ServedSettings(max_batch=8, max_queue_delay_us=2000, instances=2, threads=1, max_queue=40)


def tiny_onnx(path: Path, batch: str | int = "batch") -> Path:
    """A 1×8×8 image → 10 logits linear model, batch dimension open unless ``batch`` is a number."""
    weights = numpy_helper.from_array(np.random.default_rng(0).normal(size=(64, 10)).astype(np.float32), "w")
    shape = [helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 1, 8, 8]),
             helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])]
    graph = helper.make_graph([helper.make_node("Flatten", ["image"], ["flat"]),
                               helper.make_node("MatMul", ["flat", "w"], ["logits"])],
                              "tiny", [shape[0]], [shape[1]], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def written(tmp_path):
    model = tiny_onnx(tmp_path / "model.onnx")
    record = write_server_files(tmp_path / "serving", model, "onnxruntime", SETTINGS, "tiny")
    return tmp_path / "serving", model, record


def test_the_triton_config_holds_the_files_tensors_and_the_measured_batcher_and_parses_with_tritons_schema(written):
    folder, model, record = written
    config = parse_config((folder / record["triton_config"]).read_text(), "config.pbtxt")
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size == 8
    assert [(t.name, list(t.dims)) for t in config.input] == [("image", [1, 8, 8])]  # the batch dimension left out
    assert [(t.name, list(t.dims)) for t in config.output] == [("logits", [10])]
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert list(config.dynamic_batching.preferred_batch_size) == [8]
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 40
    assert config.instance_group[0].count == 2 and config.parameters["intra_op_thread_count"].string_value == "1"
    assert (folder / record["served_file"]).read_bytes() == model.read_bytes()
    assert check_server_files(folder, model, record) == []
    ovms = json.loads((folder / record["ovms_config"]).read_text())["model_config_list"][0]["config"]
    assert ovms["base_path"] == "models/tiny" and ovms["plugin_config"]["INFERENCE_NUM_THREADS"] == 1
    assert ovms["nireq"] == 2 and any("each request as it comes" in note for note in record["notes"])


@pytest.mark.parametrize("edit, named", [
    (lambda t: t.replace("max_batch_size: 8", "max_batch: 8"), "max_batch"),  # a field Triton does not know
    (lambda t: t.replace("KIND_CPU", "KIND_CPUS"), "KIND_CPUS"),  # an enum value it does not know
    (lambda t: t.replace("dims: 10", "dims: 12"), "output 'logits' dims [12], the file's [10]"),
    (lambda t: t.replace("TYPE_FP32", "TYPE_FP16", 1), "input 'image' is TYPE_FP16, the file's float32"),
    (lambda t: t.replace('name: "image"', 'name: "input"'), "inputs ['input'] are not the file's ['image']"),
    (lambda t: t.replace('name: "tiny"', 'name: "other"'), "is not its folder's"),
])
def test_a_broken_triton_config_is_refused_by_the_same_check_naming_what_is_wrong(written, edit, named):
    folder, model, record = written
    path = folder / record["triton_config"]
    path.write_text(edit(path.read_text()))
    problems = check_server_files(folder, model, record)
    assert problems and named in " ".join(problems) and str(path) in problems[0]


@pytest.mark.parametrize("edit, named", [
    (lambda c: c["model_config_list"][0]["config"].update(batch_sz=1), "batch_sz"),
    (lambda c: c["model_config_list"][0]["config"].pop("base_path"), "'base_path' is a required property"),
    (lambda c: c["model_config_list"][0]["config"].update(nireq=-1), "model_config_list/0/config/nireq"),
    (lambda c: c["model_config_list"][0]["config"].update(base_path="../../elsewhere"), "leaves the configuration"),
    (lambda c: c["model_config_list"][0]["config"].update(base_path="models"), "no numbered version folder"),
])
def test_a_broken_ovms_config_is_refused_by_its_schema_or_layout(written, edit, named):
    folder, model, record = written
    path = folder / record["ovms_config"]
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    problems = check_server_files(folder, model, record)
    assert problems and named in " ".join(problems)


def test_an_openvino_file_is_served_as_its_ir_with_the_onnx_files_tensor_names(tmp_path):
    import openvino as ov

    model = tiny_onnx(tmp_path / "model.onnx")
    record = write_server_files(tmp_path / "serving", model, "openvino", SETTINGS, "tiny")
    folder = tmp_path / "serving"
    assert record["served_file"] == "models/tiny/1/model.xml" and check_server_files(folder, model, record) == []
    config = parse_config((folder / record["triton_config"]).read_text(), "config.pbtxt")
    assert config.backend == "openvino" and config.parameters["INFERENCE_NUM_THREADS"].string_value == "1"
    ir = ov.Core().read_model(str(folder / record["served_file"]))
    assert [p.get_any_name() for p in ir.inputs] == ["image"] and [p.get_any_name() for p in ir.outputs] == ["logits"]


def test_a_file_with_a_fixed_batch_is_served_unbatched_with_its_full_shape(tmp_path):
    model = tiny_onnx(tmp_path / "model.onnx", batch=1)
    record = write_server_files(tmp_path / "serving", model, "onnxruntime", SETTINGS, "tiny")
    config = parse_config((tmp_path / "serving" / record["triton_config"]).read_text(), "config.pbtxt")
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [1, 1, 8, 8]
    assert not config.HasField("dynamic_batching")


def test_no_server_files_for_a_runtime_without_a_cpu_server_and_none_for_a_file_that_is_not_onnx(tmp_path):
    model = tiny_onnx(tmp_path / "model.onnx")
    with pytest.raises(ServedFileError, match="no CPU model-server configuration for 'tensorrt'"):
        write_server_files(tmp_path / "serving", model, "tensorrt", SETTINGS, "tiny")
    (tmp_path / "not.onnx").write_bytes(b"\x00garbage")
    with pytest.raises(ServedFileError, match="not a readable ONNX file"):
        onnx_tensors(tmp_path / "not.onnx")


def test_the_queue_limit_is_what_the_copies_finish_within_the_budget():
    assert queue_limit(5.0, 0.5, 1, 1) == 10  # ten 0.5 ms requests fit in 5 ms
    assert queue_limit(5.0, 0.5, 8, 2) == 160  # each copy clears a batch of 8 per service time
    assert queue_limit(0.3, 0.5, 1, 1) == 1  # slower than the budget: one may still wait
    assert queue_limit(None, 0.5, 1, 1) is None and queue_limit(5.0, None, 1, 1) is None


def _entry(traffic: dict | None) -> Entry:
    return Entry.model_validate({"name": "f", "runtime": "onnxruntime", "precision": "int8", "format": "onnx",
                                 "path": "f.onnx", "size_bytes": 1, "accuracy": {"top1": 90.0, "n": 10},
                                 "accuracy_drop": 0.0, "latency_ms": {"p50": 0.5, "p99": 0.9, "n": 100}, "runner": {"threads": 2},
                                 "traffic": traffic})


def test_the_settings_are_the_sweeps_best_else_the_at_target_tests_else_one_copy_unbatched():
    at_target = {"scenario": "server", "serving": {"max_batch": 4, "max_queue_delay_us": 500, "instances": 1,
                                                   "threads": 1}}
    best = {"label": "batch≤8", "serving": {"max_batch": 8, "max_queue_delay_us": 2000, "instances": 2,
                                            "threads": 1}}
    swept = served_settings(_entry({"scenario": "server", "at_target": at_target, "sweep": {"best": best}}), 5.0)
    assert (swept.max_batch, swept.instances, swept.max_queue) == (8, 2, 160) and "sweep" in swept.measured
    plain = served_settings(_entry({"scenario": "server", "at_target": at_target}), 5.0)
    assert (plain.max_batch, plain.max_queue_delay_us, plain.max_queue) == (4, 500, 40)
    none = served_settings(_entry(None), None)
    assert (none.max_batch, none.instances, none.max_queue, none.threads) == (1, 1, None, 2) and "no traffic" in none.measured


def test_the_card_and_the_report_state_the_served_and_in_process_p99_their_ratio_and_where_the_time_went():
    from compress.release.model_card import _serving_lines, serving_of
    from tests.report_entries import as_entry
    from tests.test_load_scenarios import run_at

    served = {**run_at(50, 21.0, (19.0, 24.0)),
              "paired": {"in_process": {"reference": "export.onnx", "ratio": 30.0, "ci": [25.0, 36.0], "rounds": 6,
                                        "verdict": "slower", "level": 0.99}}}
    entry = as_entry({"name": "export.onnx", "accuracy_drop": 0.0, "latency_ms": {"p99": 0.6},
                      "traffic": {"scenario": "server", "target_qps": 50, "at_target": run_at(50, 0.7, (0.6, 0.8)),
                                  "measured_at": "served",
                                  "served": {"server": "ray-serve", "run": served,
                                             "in_process": run_at(50, 0.7, (0.6, 0.8)),
                                             "split": {"queue_mean_ms": 9.5, "compute_mean_ms": 0.4,
                                                       "rest_mean_ms": 5.1, "refused": 0}}}})
    card = serving_of(entry)
    assert card["measured_at"] == "served" and card["served"]["p99_ratio"] == {"ratio": 30.0, "ci": [25.0, 36.0]}
    assert card["served"]["served"]["p99_ms"] == 21.0 and card["served"]["in_process"]["p99_ms"] == 0.7
    line = next(x for x in _serving_lines(card) if "through its model server" in x)
    assert "p99 21.0 ms" in line and "against p99 0.7 ms in process in the same rounds: ×30.00" in line
    assert "9.5 ms in the server's queue, 0.4 ms in the model, 5.1 ms in HTTP" in line and "gate read the served" in line
    from types import SimpleNamespace

    from serve_bench.report.traffic import served_table
    head, rows = served_table(SimpleNamespace(artifacts=[entry]))
    row = dict(zip(head, rows[0]))
    assert row["served / in process, paired [CI]"] == "×30.00 [25.00, 36.00] 99% (6 rounds)"
    assert row["served p99 ms [CI]"] == "21.000 [19.000, 24.000]" and row["HTTP and hops mean ms"] == "5.100"
    assert row["over its fp32 file, served, paired [CI]"] == "—"  # an fp32 file: no such pair
    from serve_bench.report_model.sections import TrafficRatio

    entry.traffic.served.run.paired["fp32"] = TrafficRatio(reference="export.fp32", ratio=0.8, ci=[0.7, 0.9],
                                                          rounds=6, verdict="faster", level=0.99, through="served")
    head, rows = served_table(SimpleNamespace(artifacts=[entry]))
    assert dict(zip(head, rows[0]))["over its fp32 file, served, paired [CI]"] == \
        "×0.80 [0.70, 0.90] 99% (6 rounds, over export.fp32)"
    failed = as_entry({"name": "train.model", "accuracy_drop": 0.0, "latency_ms": {"p99": 9.0},
                       "traffic": {"scenario": "server", "served": {"failed": "not served: no model server here "
                                                                              "runs this file"}}})
    assert any("not measured: not served: no model server" in x for x in _serving_lines(serving_of(failed)))


def test_what_ships_under_measured_at_served_is_the_served_runs_settings_else_the_measured_in_process_ones():
    from serve_bench.servers.deployment import served_settings
    from tests.report_entries import as_entry
    from tests.test_load_scenarios import run_at

    at_target = {**run_at(50, 0.7, (0.6, 0.8)), "serving": {"max_batch": 8, "max_queue_delay_us": 2000,
                                                            "instances": 1, "threads": 1}}
    served = {"server": "ray-serve", "run": run_at(50, 21.0, (19.0, 24.0)),
              "settings": {"max_batch": 4, "max_queue_delay_us": 500, "instances": 2, "threads": 1, "max_queue": 7,
                           "measured": "the configuration of the test at the pipeline's traffic"}}

    def entry(measured_at: str | None) -> object:
        return as_entry({"name": "export.onnx", "accuracy_drop": 0.0, "latency_ms": {"p50": 0.5, "p99": 0.6},
                         "traffic": {"scenario": "server", "target_qps": 50, "at_target": at_target, "served": served,
                                     **({"measured_at": measured_at} if measured_at else {})}})

    gated_served = served_settings(entry("served"), budget_ms=5.0)
    assert (gated_served.max_batch, gated_served.instances, gated_served.max_queue) == (4, 2, 7)
    assert gated_served.measured == "the served run the gate read"
    in_process = served_settings(entry(None), budget_ms=5.0)
    assert (in_process.max_batch, in_process.instances) == (8, 1) and in_process.max_queue == 10 * 8
    best = {"label": "batch≤8, 2 copies", "serving": {"max_batch": 8, "max_queue_delay_us": 2000, "instances": 2,
                                                      "threads": 1}, "capacity": {"qps": 90.0, "budget_ms": 5.0},
            "max_queue": 12}
    served["sweep"] = {"configs": [best], "best": best}
    swept = served_settings(entry("served"), budget_ms=5.0)  # gated through its server: that sweep's best ships
    assert (swept.max_batch, swept.instances, swept.max_queue) == (8, 2, 12) and "served sweep" in swept.measured
    assert served_settings(entry(None), budget_ms=5.0).max_queue == 80  # gated in process: the in-process choice
    regated = served_settings(entry("served"), budget_ms=8.0)  # judged against another budget: not the choice
    best["capacity"]["qps"] = 40.0  # carried less than the pipeline's 50/s: the settings gated at 50/s ship
    short = served_settings(entry("served"), budget_ms=5.0)
    assert (regated.max_batch, short.max_batch) == (4, 4) and short.measured == "the served run the gate read"


def test_the_capacity_table_and_the_card_state_the_load_the_server_sustains_beside_the_same_configuration_in_process():
    from types import SimpleNamespace

    from compress.release.model_card import _serving_lines, serving_of
    from serve_bench.report.traffic import capacity_table
    from tests.report_entries import as_entry
    from tests.test_load_scenarios import run_at

    def config(qps: float | None, failed: str | None = None) -> dict:
        return {"label": "batch 1", "serving": {"max_batch": 1, "max_queue_delay_us": 0, "instances": 1, "threads": 1},
                "curve": [run_at(60.0, 4.0, (3.5, 4.5))], "max_queue": 4, "failed": failed,
                "capacity": None if qps is None else {"qps": qps, "ci": [qps * 0.8, qps * 1.1], "budget_ms": 5.0,
                                                      "rule": "point", "bracket": [qps, qps * 1.2]}}

    served_best = config(60.0)
    entry = as_entry({"name": "export.onnx", "accuracy_drop": 0.0, "latency_ms": {"p99": 0.6},
                      "traffic": {"scenario": "server", "target_qps": 50, "at_target": run_at(50, 0.7, (0.6, 0.8)),
                                  "sweep": {"configs": [config(240.0)], "best": config(240.0)},
                                  "served": {"server": "ray-serve", "run": run_at(50, 3.0, (2.7, 3.3)),
                                             "in_process": run_at(50, 0.7, (0.6, 0.8)),
                                             "sweep": {"configs": [served_best, {**config(None, "ServerError: "
                                                                                 "gone"), "label": "batch≤8"}],
                                                       "best": served_best}}}})
    head, rows = capacity_table(SimpleNamespace(artifacts=[entry]))
    served_rows = [dict(zip(head, r)) for r in rows if r[0] == "export.onnx through ray-serve"]
    assert len(rows) == 3 and len(served_rows) == 2
    assert "in process 240.0/s: the server keeps 25% of it" in served_rows[0]["note"]
    assert "queue limit 4" in served_rows[0]["serving"] and served_rows[1]["note"].startswith("ServerError: gone")
    line = next(x for x in _serving_lines(serving_of(entry)) if "most traffic" in x and "model server" in x)
    assert "60.0 queries/s [48, 66]" in line and "server's own batcher" in line

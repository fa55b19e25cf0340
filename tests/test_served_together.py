"""Files measured side by side share one server: an INT8 file is served with its fp32 file (so their ratio is
paired round by round), the server's processes count as the file's own when the bench asks how busy the machine
was, and Ray Serve's limits carry the measured queue limit (its router's queue is only part of what waits)."""
from __future__ import annotations

import subprocess
import sys

from serve_bench.latency.machine_load import LoadSampler, busy_machine_flag, process_tree
from serve_bench.latency.served import served_groups
from serve_bench.servers.base import ServedModel, ServerError
from serve_bench.servers.deployment import ServedSettings
from serve_bench.servers.ray_serve.app import ray_limits
from serve_bench.servers.ray_serve.server import RayServeServer


def test_an_int8_file_is_served_with_its_fp32_file_and_every_other_file_alone():
    names = ["export.onnx", "quantize.onnx_cpu", "quantize.onnx_openvino", "export.onnx@openvino", "other.onnx",
             "quantize.lone"]
    pairs = {"quantize.onnx_cpu": {"fp32": "export.onnx"}, "quantize.onnx_openvino": {"fp32": "export.onnx@openvino"},
             "quantize.lone": {"fp32": "train.model"}}  # its fp32 file is not served: alone
    assert served_groups(names, pairs) == [["export.onnx", "quantize.onnx_cpu"],
                                           ["export.onnx@openvino", "quantize.onnx_openvino"], ["other.onnx"],
                                           ["quantize.lone"]]
    # two INT8 files of one fp32 file: one server for the three, the fp32 file first
    assert served_groups(["a8", "b8", "f"], {"a8": {"fp32": "f"}, "b8": {"fp32": "f"}}) == [["f", "a8", "b8"]]


def test_ray_serves_limits_hold_the_queue_limit_counting_what_waits_at_each_replica():
    """Ray's router queue is only part of what waits: a replica holds all but one of its ongoing requests
    waiting. The two limits together let exactly the queue limit wait, whatever its size."""
    one = {"max_batch": 1, "instances": 1, "max_queue": 21}
    # a replica holds 4 (one in the model, 3 waiting): 18 more may wait at the router
    assert ray_limits(one) == {"max_ongoing_requests": 4, "max_queued_requests": 18, "waiting_at_most": 21}
    # two copies batching 8: each holds a batch in the model and one forming
    assert ray_limits({"max_batch": 8, "instances": 2, "max_queue": 100}) == {
        "max_ongoing_requests": 16, "max_queued_requests": 70, "waiting_at_most": 100}
    assert ray_limits({**one, "max_queue": None})["max_queued_requests"] == -1  # no limit asked: none
    for batch in (1, 2, 4, 8):  # every limit the bench writes (k batches per copy) holds exactly
        for copies in (1, 2, 3):
            for k in (1, 2, 5, 40):
                limits = ray_limits({"max_batch": batch, "instances": copies, "max_queue": k * batch * copies})
                assert limits["waiting_at_most"] == k * batch * copies, (batch, copies, k, limits)
                assert limits["max_ongoing_requests"] >= batch and limits["max_queued_requests"] >= 1
    # a limit under a batch per copy cannot hold: said, not hidden
    assert ray_limits({"max_batch": 8, "instances": 1, "max_queue": 4})["waiting_at_most"] == 8


def test_one_server_serves_several_files_each_under_its_own_name(tmp_path):
    from tests.test_server_files import tiny_onnx

    model = tiny_onnx(tmp_path / "model.onnx")
    settings = ServedSettings(max_batch=2, max_queue=10)
    server = RayServeServer(model, "onnxruntime", settings, model="fp32",
                            also=(ServedModel(model, "onnxruntime", settings.model_copy(update={"max_batch": 4}),
                                              "int8"),))
    assert [m.model for m in server.models] == ["fp32", "int8"]
    assert [m.settings.max_batch for m in server.models] == [2, 4]
    try:
        RayServeServer(model, "onnxruntime", settings, model="same", also=(ServedModel(model, "onnxruntime",
                                                                                       settings, "same"),))
    except ServerError as exc:
        assert "two served files under one name" in str(exc)
    else:
        raise AssertionError("two files under one name were accepted")


def test_a_servers_processes_and_those_it_starts_are_the_files_own_cpu_time(tmp_path):
    """A parent that starts a child which spins: the child is found under the parent, and the sampler that names
    the parent's tree counts the child's time as its own, so the machine does not read as busy with others. The
    child says when it is there and when it has spun ten clock ticks of CPU past the first snapshot: the test
    waits on what the child says, never on a clock."""
    spin = ("import os, sys\nprint('ready', flush=True)\nsys.stdin.readline()\nt = os.times()\n"
            "start = t.user + t.system\nsaid = False\nwhile True:\n    t = os.times()\n"
            "    if not said and t.user + t.system - start >= 0.1:\n        print('spun', flush=True)\n"
            "        said = True\n")
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', "
                                                     f"{spin!r}])"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        tree = process_tree([parent.pid])
        assert tree[0] == parent.pid and len(tree) == 2
        sampler = LoadSampler([], trees=[parent.pid])
        before = sampler.snapshot()
        assert set(before[2]) == set(tree)
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "spun"  # ten ticks (0.1 s of CPU) past the snapshot
        with_tree = sampler.other_share(before)
        without = LoadSampler([]).other_share((*before[:2], {}))
        # the same interval but for a moment: the child's ticks are the tree's own, not other processes'
        assert with_tree is not None and without is not None and with_tree < without
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)  # the child first: orphaned, it would spin on
        parent.kill()
        parent.wait()


def test_a_busy_machine_through_the_server_is_flagged():
    entry = {"name": "export.onnx", "traffic": {"served": {"machine_load": {"other_share_mean": 0.6,
                                                                            "other_share_max": 0.8, "blocks": 12}}}}
    flag = busy_machine_flag([entry])
    assert flag is not None and "export.onnx (through its server)" in flag


def test_a_group_whose_server_fails_is_served_again_file_by_file_so_one_fault_does_not_cost_the_other(monkeypatch):
    """The INT8 file's application cannot start beside its fp32 file: each is then served on its own server, the
    fp32 file keeps its figure, and the record says the pair failed and why."""
    from types import SimpleNamespace

    from serve_bench.latency import served

    starts = []

    class Server:
        def __init__(self, path, runtime, settings, *, model, also=(), **kwargs):
            self.models = [model, *(m.model for m in also)]
            self.host, self.http_port = "127.0.0.1", 1

        def __enter__(self):
            starts.append(self.models)
            if "int8_onnx" in self.models:
                raise ServerError("the application int8_onnx failed to deploy: its runner could not load the file")
            return self

        def __exit__(self, *exc):
            pass

        def processes(self):
            return []

        def limits(self, model=None):
            return {"waiting_at_most": 10}

    class Client:
        def __init__(self, *args, **kwargs):
            self.process = SimpleNamespace(pid=0)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    def rounds(workers, clients, *args, **kwargs):
        return {n: {"run": {"offered_qps": 20.0}, "in_process": {}, "split": {}} for n in workers}

    monkeypatch.setattr(served, "make_server", Server)
    monkeypatch.setattr(served, "ServedWorker", Client)
    monkeypatch.setattr(served, "_served_rounds", rounds)
    alive = SimpleNamespace(process=SimpleNamespace(pid=0, is_alive=lambda: True))
    files = {n: {"runtime": "onnxruntime", "path": f"/{n}"} for n in ("fp32.onnx", "int8.onnx")}
    said: list[str] = []
    out = served.measure_served({n: alive for n in files}, files, scenario={}, rule=None, budget_ms=10.0,
                                serving={n: {"max_batch": 1} for n in files}, service_ms={}, pool=None,
                                round_s=1.0, settle_s=0.0, say=said.append, pairs={"int8.onnx": {"fp32": "fp32.onnx"}})
    assert starts == [["fp32_onnx", "int8_onnx"], ["fp32_onnx"], ["int8_onnx"]]
    assert "run" in out["fp32.onnx"] and "failed" not in out["fp32.onnx"]
    assert "failed to deploy" in out["int8.onnx"]["failed"]
    assert all("failed to deploy" in out[n]["served_together_failed"] for n in files)
    assert any("served together, stopped; each is served again on its own" in line for line in said)


def test_files_whose_names_make_the_same_route_get_routes_of_their_own():
    from serve_bench.latency.served import route_names

    assert route_names(["a.b", "a_b", "a-b"]) == {"a.b": "a_b", "a_b": "a_b-2", "a-b": "a-b"}

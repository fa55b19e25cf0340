"""A file served on a real model server (Ray Serve) on loopback: its answers are the file's, a request that
does not fit is refused naming the input while the server stays up, overload is refused by the queue limit and
counted. A server killed mid-measurement is tested where the bench meets it (tests/test_served_scenario.py). A
server takes about 15 s to start on 2 cores, so these are marked slow."""
from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest

from serve_bench.servers.base import ServerError
from serve_bench.servers.deployment import ServedSettings
from serve_bench.servers.http_client import HttpClient, Refused
from serve_bench.servers.registry import make_server
from tests.test_server_files import tiny_onnx

pytestmark = pytest.mark.slow

SETTINGS = ServedSettings(max_batch=4, max_queue_delay_us=500, instances=1, threads=1)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = tiny_onnx(tmp_path_factory.mktemp("served") / "model.onnx")
    with make_server(model, "onnxruntime", SETTINGS, model="tiny") as server:
        yield server, model


def _in_process(model, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {"image": x})[0]


def test_the_served_file_answers_as_the_file_does_in_process(served):
    server, model = served
    client = server.client()
    assert client.metadata()["inputs"] == [{"name": "image", "dtype": "float32", "shape": [1, 8, 8]}]
    x = np.random.default_rng(1).normal(size=(6, 1, 8, 8)).astype(np.float32)
    expected = _in_process(model, x)
    raw = np.stack([client.infer(sample) for sample in x])
    as_json = np.array([client.infer_json(sample.tolist())["outputs"] for sample in x], dtype=np.float32)
    np.testing.assert_allclose(raw, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(as_json, expected, rtol=1e-5, atol=1e-5)


def test_a_request_that_does_not_fit_is_refused_naming_the_input_and_the_server_stays_up(served):
    server, model = served
    client = server.client()
    before = server.statistics()
    with pytest.raises(ServerError, match=r"HTTP 400: the body holds 36 bytes; the model takes input 'image': one "
                                          r"request of shape \[1, 8, 8\] float32 \(256 bytes raw"):
        client.infer(np.zeros((3, 3), np.float32))
    with pytest.raises(ServerError, match=r"HTTP 400: the JSON inputs have shape \[2, 8, 8\]"):
        client.infer_json(np.zeros((2, 8, 8)).tolist())
    x = np.ones((1, 8, 8), np.float32)
    np.testing.assert_allclose(client.infer(x), _in_process(model, x[None])[0], rtol=1e-5, atol=1e-5)
    counted = server.statistics().since(before)
    assert (counted.success, counted.failed) == (1, 0)  # the refused ones never reached the model
    assert counted.queue_ns > 0 and counted.compute_ns > 0 and counted.batches == 1


def test_overload_is_refused_by_the_queue_limit_and_counted_while_the_rest_are_answered(tmp_path):
    model = tiny_onnx(tmp_path / "model.onnx")
    settings = ServedSettings(max_batch=1, instances=1, threads=1, max_queue=8)  # 8 may wait, no more
    with make_server(model, "onnxruntime", settings, model="tiny") as server:
        outcomes: list[str] = []
        lock = threading.Lock()

        def hammer() -> None:
            client = HttpClient(server.host, server.http_port, "tiny")
            for _ in range(25):
                try:
                    client.infer(np.ones((1, 8, 8), np.float32))
                    outcome = "answered"
                except Refused:
                    outcome = "refused"
                with lock:
                    outcomes.append(outcome)

        threads = [threading.Thread(target=hammer) for _ in range(48)]  # 48 at once against 1 in the model + 8
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        refused, answered = outcomes.count("refused"), outcomes.count("answered")
        assert refused + answered == 48 * 25 and refused >= 50 and answered >= 50
        assert server.statistics().success == answered  # the server's count of what it served is the client's
        assert server.limits()["waiting_at_most"] == 8  # Ray's router and replica places hold the limit together
        assert server.client().infer(np.ones((1, 8, 8), np.float32)).shape == (10,)  # and it still answers

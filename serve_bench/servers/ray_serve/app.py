"""The application ``compress serve`` runs on Ray Serve: the released file, batched as the bench measured it.

One deployment (``ReleasedModel``), one replica per measured model copy, each with its own runner of the
runtime the file was measured on (its threads as measured). Requests join a batch in Ray Serve's own batcher
(``serve.batch``: at most ``max_batch``, the oldest waiting at most the queue delay); the batch runs in a
worker thread, so the replica keeps taking requests while the model computes. Past ``max_queue`` requests
waiting, Ray Serve refuses more (HTTP 503) instead of letting the queue grow.

The protocol, under ``/<model>``:

- ``GET /<model>``: what to send: the input's name, per-request shape and dtype; the output's; the settings.
- ``POST /<model>/infer`` with one request's input, either as raw bytes (``application/octet-stream``: the
  per-request shape, C order, little-endian), answered with the output's raw bytes (``X-Output-Shape`` and
  ``X-Output-Dtype`` say how to read them), or as JSON ``{"inputs": [...]}`` (nested lists), answered with
  ``{"outputs": [...]}``. Anything else gets 400 naming the tensor the file expects, and the server stays up.
- ``GET /<model>/stats``: every replica's requests, failures, batches, and the time requests spent waiting
  for their batch and in the model (ns, summed): the server's own account, beside a client's.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

log = logging.getLogger(__name__)

STATS_ACTOR = "compress-served-statistics"


def board_name(model: str) -> str:
    """The statistics actor of one served file (a server may serve several, each with its own account)."""
    return f"{STATS_ACTOR}:{model}"


def ray_limits(settings: dict) -> dict:
    """Ray Serve's two limits for the measured settings, and the most requests that may then wait.

    A replica takes up to ``max_ongoing_requests`` at once: a batch in the model and the next one forming (twice
    the largest batch, four requests at least, so a replica of a sub-millisecond file is not left idle by the
    router's hop between two requests). All but one of those may be waiting (a batch of one in the model), and
    Ray's ``max_queued_requests`` counts only the requests its router holds back. So the queue limit
    (``max_queue``: requests that may wait, the same figure as Triton's ``max_queue_size``) is split: each replica
    holds no more than its share of it, and the router the rest (one at least). ``waiting_at_most`` is what the
    two allow together: the queue limit, except where it is under one waiting place per copy and one at the
    router (Ray cannot refuse sooner)."""
    batch, copies, limit = settings["max_batch"], settings["instances"], settings.get("max_queue")
    ongoing = max(2 * batch, 4)
    if not limit:
        return {"max_ongoing_requests": ongoing, "max_queued_requests": -1, "waiting_at_most": None}
    share = (limit - 1) // copies + 1  # the most a replica may hold with its waiting places within limit - 1
    ongoing = max(batch, min(ongoing, share))
    at_replicas = copies * (ongoing - 1)
    queued = max(1, limit - at_replicas)
    return {"max_ongoing_requests": ongoing, "max_queued_requests": queued, "waiting_at_most": at_replicas + queued}


def statistics_board():
    """A Ray actor that sums what every replica reports after each batch (one per served file)."""
    import ray

    @ray.remote(num_cpus=0)
    class StatisticsBoard:
        def __init__(self) -> None:
            self.totals = {"success": 0, "failed": 0, "queue_ns": 0, "compute_ns": 0, "batches": 0}

        def add(self, **counts: int) -> None:
            for key, value in counts.items():
                self.totals[key] += value

        def read(self) -> dict:
            return dict(self.totals)

    return StatisticsBoard


def deployment(settings: dict):
    """The Ray Serve deployment class, configured with the measured copies and queue limit."""
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    limits = ray_limits(settings)

    @serve.deployment(num_replicas=settings["instances"], max_ongoing_requests=limits["max_ongoing_requests"],
                      max_queued_requests=limits["max_queued_requests"],
                      # a stop answers what is in flight, then ends (Serve's defaults wait up to 20 s per replica)
                      graceful_shutdown_wait_loop_s=0.2, graceful_shutdown_timeout_s=5,
                      ray_actor_options={"num_cpus": 0})
    class ReleasedModel:
        def __init__(self, file: str, runtime: str, model: str, threads: int, runner_options: dict,
                     tensors: dict, board_namespace: str) -> None:
            import ray

            from serve_bench.runners import make_runner

            self.runner = make_runner(runtime, file, threads=threads, **runner_options).load()
            self.model, self.tensors = model, tensors
            self.input = tensors["inputs"][0]
            self.shape = tuple(self.input["shape"])
            self.dtype = np.dtype(self.input["dtype"])
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
            self.board = ray.get_actor(board_name(model), namespace=board_namespace)
            self.batched.set_max_batch_size(settings["max_batch"])
            self.batched.set_batch_wait_timeout_s(settings["max_queue_delay_us"] / 1e6)
            for size in range(1, settings["max_batch"] + 1):  # every batch size once before the first request
                self.runner.infer(np.zeros((size, *self.shape), dtype=self.dtype))

        def _run(self, batch: np.ndarray) -> np.ndarray:
            return np.asarray(self.runner.infer(batch))

        @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.0)
        async def batched(self, requests: list) -> list:
            start = time.perf_counter_ns()
            try:
                outputs = await asyncio.get_running_loop().run_in_executor(
                    self.pool, self._run, np.stack([x for x, _ in requests]))
            except Exception as exc:  # every request of the batch answers with the runtime's error
                self.board.add.remote(failed=len(requests), batches=1)
                return [exc] * len(requests)
            compute = time.perf_counter_ns() - start
            self.board.add.remote(success=len(requests), batches=1, compute_ns=compute * len(requests),
                                  queue_ns=sum(start - arrived for _, arrived in requests))
            return list(outputs)

        def _refuse(self, why: str) -> JSONResponse:
            expected = (f"input {self.input['name']!r}: one request of shape {list(self.shape)} {self.dtype.name} "
                        f"({int(np.prod(self.shape)) * self.dtype.itemsize} bytes raw, or JSON "
                        '{"inputs": nested lists})')
            return JSONResponse({"error": f"{why}; the model takes {expected}"}, status_code=400)

        async def __call__(self, request: Request):
            path = request.url.path.rstrip("/").split("/")
            if request.method == "GET" and path[-1] == "stats":
                return JSONResponse(await self.board.read.remote())
            if request.method == "GET":
                return JSONResponse({"model": self.model, **self.tensors, "settings": settings, "limits": limits})
            if request.method != "POST" or path[-1] != "infer":
                return JSONResponse({"error": f"POST /{self.model}/infer, GET /{self.model} or GET "
                                              f"/{self.model}/stats"}, status_code=404)
            arrived = time.perf_counter_ns()
            body = await request.body()
            as_json = "json" in request.headers.get("content-type", "")
            try:
                x = self._parse(body, as_json)
            except ValueError as exc:
                return self._refuse(str(exc))
            output = await self.batched((x, arrived))
            if isinstance(output, Exception):
                return JSONResponse({"error": f"the model failed: {type(output).__name__}: {output}"},
                                    status_code=500)
            if as_json:
                return JSONResponse({"outputs": output.tolist(), "output": self.tensors["outputs"][0]["name"]})
            return Response(content=np.ascontiguousarray(output).tobytes(), media_type="application/octet-stream",
                            headers={"X-Output-Shape": json.dumps(list(output.shape)),
                                     "X-Output-Dtype": output.dtype.name})

        def _parse(self, body: bytes, as_json: bool) -> np.ndarray:
            if as_json:
                try:
                    values = json.loads(body)["inputs"]
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise ValueError(f"the JSON body has no \"inputs\" ({type(exc).__name__})") from exc
                x = np.asarray(values, dtype=self.dtype)
                if x.shape != self.shape:
                    raise ValueError(f"the JSON inputs have shape {list(x.shape)}")
                return x
            want = int(np.prod(self.shape)) * self.dtype.itemsize
            if len(body) != want:
                raise ValueError(f"the body holds {len(body)} bytes")
            return np.frombuffer(body, dtype=self.dtype).reshape(self.shape)

    return ReleasedModel

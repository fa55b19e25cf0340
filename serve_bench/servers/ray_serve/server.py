"""Ray Serve behind the model-server interface: start, ready, client, statistics, stop.

Chosen over Triton through PyTriton (the other server that installs from the package index here): PyTriton
0.7's Python-backend stub is built against numpy 1's C interface and, in an environment with numpy 2 (this
project's), answers every request with an empty output (HTTP 500 "output tensor shape does not match"), so
it cannot serve in the project's own environment. Ray Serve installs beside Ray (already the search's
engine), batches requests in its own batcher (``serve.batch``), runs a replica per model copy, refuses
requests past a queue limit (HTTP 503), answers a health check (``/-/healthz``) and scales out to a
cluster. What it costs over the file alone is what the served scenario measures. The Triton repository and
OpenVINO Model Server config in a release are for those servers' native backends
(serve_bench.servers.deployment).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from serve_bench.servers.base import ModelServer, ServerError, ServerStatistics, first_output, wait_until_ready
from serve_bench.servers.http_client import HttpClient, get_json
from serve_bench.servers.tensors import onnx_tensors

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60.0
STARTS = 2  # Ray's own start can fail on a busy machine (an agent that exits at once): one more try, then the error


class RayServeServer(ModelServer):
    name = "ray-serve"
    title = "Ray Serve"
    install_hint = "pip install 'ray[serve]'"

    _process: subprocess.Popen | None = None

    @classmethod
    def unusable(cls) -> str | None:
        try:
            import ray.serve  # noqa: F401
            import starlette  # noqa: F401
        except ImportError as exc:
            return f"Ray Serve is not installed ({exc}): {cls.install_hint}"
        return None

    def start(self) -> "RayServeServer":
        problem = self.unusable()
        if problem:
            raise ServerError(problem)
        apps = []
        for served in self.models:
            inputs, outputs = onnx_tensors(served.file)
            apps.append({"file": str(Path(served.file).resolve()), "runtime": served.runtime, "model": served.model,
                         "settings": served.settings.model_dump(), "threads": served.settings.threads or 1,
                         "runner_options": served.runner_options,
                         "tensors": {"inputs": [_spec(t) for t in inputs],
                                     "outputs": [_spec(t) for t in first_output(outputs)]}})
        spec = {"host": self.host, "http_port": self.http_port, "apps": apps,
                "cpus": max(2, sum(m.settings.instances for m in self.models) + 1)}
        self._folder = Path(tempfile.mkdtemp(prefix="compress-serve-"))
        (self._folder / "spec.json").write_text(json.dumps(spec))
        self._log = open(self._folder / "server.log", "wb")
        self._process = subprocess.Popen([sys.executable, "-m", "serve_bench.servers.ray_serve.process",
                                          str(self._folder / "spec.json")], stdout=self._log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def log_file(self) -> Path:
        return self._folder / "server.log"

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def processes(self) -> list[int]:
        return [self._process.pid] if self._process is not None else []

    def limits(self, model: str | None = None) -> dict:
        from serve_bench.servers.ray_serve.app import ray_limits

        served = next(m for m in self.models if m.model == (model or self.model))
        return ray_limits(served.settings.model_dump())

    def ready(self, timeout_s: float = 180.0) -> "RayServeServer":
        """Wait until the application answers. A server whose process ended before it was ready (seen when
        Ray's runtime-env agent exited at start beside another Ray instance on 2 busy cores, and the raylet
        with it) is started once more; a second end, or a timeout, is the error."""
        for attempt in range(1, STARTS + 1):
            what = f"{self.title} serving {', '.join(m.file.name for m in self.models)} (log: {self.log_file})"
            try:
                for served in self.models:
                    wait_until_ready(f"{self.endpoint.http}/{served.model}", timeout_s, self.alive, what)
                return self
            except ServerError as exc:
                if attempt == STARTS or self.alive():
                    raise
                log.warning("%s; starting it once more", exc)
                self._log.close()
                self.start()
        return self

    def client(self) -> HttpClient:
        return HttpClient(self.host, self.http_port, self.model)

    def statistics(self, model: str | None = None) -> ServerStatistics:
        totals = get_json(f"{self.endpoint.http}/{model or self.model}/stats")
        return ServerStatistics(**{k: int(totals[k]) for k in ("success", "failed", "queue_ns", "compute_ns",
                                                                "batches")})

    def stop(self) -> None:
        """SIGTERM to the server's own process, which shuts Serve and Ray down in order; then SIGKILL to whatever of
        its process group is left (or to all of it past the timeout). A SIGTERM to the whole group would reach
        Ray's controller before Serve asks it to stop, and Serve then waits 30 s for it."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(process.pid, signal.SIGKILL)  # Ray's processes that outlived it, if any
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()
        self._log.close()
        self._process = None


def _spec(tensor) -> dict:
    return {"name": tensor.name, "dtype": tensor.dtype, "shape": list(tensor.per_request())}

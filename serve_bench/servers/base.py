"""What every model server is to the rest of the project: start, ready, client, statistics, stop.

The traffic code and ``compress serve`` never branch on which server it is: a server is one folder
(``serve_bench/servers/<name>/``) with one class behind this interface, as a runtime is one runner. A server
runs the released file with the runtime it was measured on, in the serving settings the bench chose (its
batcher's largest batch and queue delay, its model copies, their threads, the queue limit), binds
127.0.0.1 unless told otherwise, and answers a health check.
"""
from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from serve_bench.errors import BenchError
from serve_bench.servers.deployment import ServedSettings


class ServerError(BenchError):
    """A model server could not start, stopped answering, or refused what it was given."""


@dataclass(frozen=True)
class Endpoint:
    """Where a started server listens."""

    host: str
    http_port: int
    grpc_port: int | None = None

    @property
    def http(self) -> str:
        return f"http://{self.host}:{self.http_port}"


@dataclass(frozen=True)
class ServerStatistics:
    """The server's own account of the requests it took since it started (cumulative): how many succeeded and
    failed, and the time they spent waiting in its queue and in the model, in ns, summed over requests."""

    success: int
    failed: int
    queue_ns: int
    compute_ns: int
    batches: int

    def since(self, before: "ServerStatistics") -> "ServerStatistics":
        return ServerStatistics(*(getattr(self, f) - getattr(before, f) for f in
                                  ("success", "failed", "queue_ns", "compute_ns", "batches")))

    def per_request_ms(self) -> dict[str, float | None]:
        """Mean queue and compute time per successful request, in ms."""
        if self.success <= 0:
            return {"queue_mean_ms": None, "compute_mean_ms": None}
        return {"queue_mean_ms": round(self.queue_ns / self.success / 1e6, 6),
                "compute_mean_ms": round(self.compute_ns / self.success / 1e6, 6)}


@dataclass(frozen=True)
class ServedModel:
    """One more file a server serves beside its first, under its own name and settings: files measured side by
    side (an INT8 file and its fp32 file, in the same rounds) share one server, so the machine holds one."""

    file: Path
    runtime: str
    settings: ServedSettings
    model: str
    runner_options: dict = field(default_factory=dict)


class ModelServer:
    """One model server serving one file (and any ``also``, each under its own name). Subclasses implement the
    five verbs; ``name`` is the registry's."""

    name: ClassVar[str]
    title: ClassVar[str] = ""
    install_hint: ClassVar[str] = ""

    def __init__(self, file: str | Path, runtime: str, settings: ServedSettings, *, model: str = "model",
                 host: str = "127.0.0.1", http_port: int | None = None, grpc_port: int | None = None,
                 runner_options: dict | None = None, also: tuple[ServedModel, ...] = ()) -> None:
        self.file, self.runtime, self.settings, self.model = Path(file), runtime, settings, model
        self.host, self.runner_options = host, dict(runner_options or {})
        self.models = [ServedModel(self.file, runtime, settings, model, self.runner_options), *also]
        if len({m.model for m in self.models}) != len(self.models):
            raise ServerError(f"two served files under one name: {', '.join(m.model for m in self.models)}")
        self.http_port = http_port or free_port(host)
        self.grpc_port = grpc_port or free_port(host)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.host, self.http_port, self.grpc_port)

    def start(self) -> "ModelServer":
        raise NotImplementedError

    def ready(self, timeout_s: float = 120.0) -> "ModelServer":
        raise NotImplementedError

    def client(self):
        raise NotImplementedError

    def statistics(self, model: str | None = None) -> ServerStatistics:
        """The server's own account for ``model`` (the first file's by default)."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def limits(self, model: str | None = None) -> dict:
        """The server's own names and values for the queue limit of ``model`` (the first file's by default), with
        ``waiting_at_most``: how many requests may wait before it refuses, as this server counts them."""
        raise NotImplementedError

    def processes(self) -> list[int]:
        """The server's own processes (each with all it starts under it): their CPU time is the server's, not a
        neighbour's, when the bench asks how busy the machine was."""
        raise NotImplementedError

    @property
    def log_file(self) -> Path:
        raise NotImplementedError

    def __enter__(self) -> "ModelServer":
        return self.start().ready()

    def __exit__(self, *exc) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS's choice); the server binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_until_ready(url: str, timeout_s: float, alive, what: str) -> None:
    """Poll ``url`` until it answers 200; a process that died (``alive()`` false) or ``timeout_s`` is a
    ServerError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not alive():
            raise ServerError(f"{what} stopped before it was ready ({last})")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
                last = f"HTTP {answer.status}"
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last = str(exc)
        time.sleep(0.2)
    raise ServerError(f"{what} was not ready within {timeout_s:.0f} s ({last})")


def first_output(outputs: list) -> list:
    """The served outputs: the runners answer with a file's first output, so a file with more is refused."""
    if len(outputs) != 1:
        raise ServerError(f"the file has {len(outputs)} outputs ({', '.join(o.name for o in outputs)}); serving "
                          "answers with one output (a classifier's logits): serve it from the bundle's Triton "
                          "repository instead")
    return outputs

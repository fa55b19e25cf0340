"""The model servers by name, and serving one file in the foreground until Ctrl-C or SIGTERM."""
from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Callable

from serve_bench.servers.base import ModelServer, ServerError
from serve_bench.servers.deployment import ServedSettings
from serve_bench.servers.ray_serve.server import RayServeServer

SERVERS: dict[str, type[ModelServer]] = {RayServeServer.name: RayServeServer}
DEFAULT_SERVER = RayServeServer.name


def make_server(file: str | Path, runtime: str, settings: ServedSettings, *, server: str = DEFAULT_SERVER,
                **kwargs) -> ModelServer:
    if server not in SERVERS:
        raise ServerError(f"unknown model server {server!r}; known: {', '.join(SERVERS)}")
    return SERVERS[server](file, runtime, settings, **kwargs)


def serve_until_stopped(file: Path, runtime: str, settings: ServedSettings, *, model: str, host: str, port: int,
                        runner_options: dict, source: str, say: Callable[[str], None],
                        server: str = DEFAULT_SERVER) -> int:
    """Start the server, say where it answers and how to call it, wait for SIGINT or SIGTERM (or the server's
    end), stop it. 0 on a clean stop; 3 when the server died on its own (its log named)."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    served = make_server(file, runtime, settings, server=server, model=model, host=host, http_port=port,
                         runner_options=runner_options)
    try:
        say(f"starting {served.title} for {file.name} on {runtime} ({source}); {settings.label()}, queue limit "
            f"{settings.max_queue or 'none'} ({settings.measured or 'as given'})")
        served.start().ready()
        url = f"{served.endpoint.http}/{model}"
        say(f"serving {url}\n  health:  curl {served.endpoint.http}/-/healthz\n  model:   curl {url}\n"
            f"  answer:  curl -X POST {url}/infer -H 'Content-Type: application/json' -d '{{\"inputs\": ...}}'\n"
            f"  server statistics: curl {url}/stats\nCtrl-C stops it.")
        while not stop.wait(1.0):
            if not served.alive():
                say(f"the server stopped on its own; its log: {served.log_file}")
                return 3
        say("stopping")
        return 0
    finally:
        served.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

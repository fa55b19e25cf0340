"""The server's own process: a local Ray cluster, Ray Serve's HTTP proxy on the asked host and port, the
released file's application (one per file where it serves several), then a wait for SIGTERM or SIGINT, on which it shuts Serve and Ray down.

Run as ``python -m serve_bench.servers.ray_serve.process SPEC.json`` by :class:`RayServeServer`; one process
per served file, so the bench and ``compress serve`` start and stop it alike and a crash stays in it.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

log = logging.getLogger(__name__)


def serve_until_signalled(spec: dict) -> int:
    import ray
    from ray import serve

    from serve_bench.servers.ray_serve.app import board_name, deployment, statistics_board

    namespace = f"compress-serve-{os.getpid()}"
    ray.init(address="local", namespace=namespace, num_cpus=spec["cpus"], include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # after ray.init, which installs its own SIGTERM handler
        signal.signal(sig, lambda *_: stop.set())
    try:
        # one statistics actor per served file, held here (an actor without a handle ends)
        boards = [statistics_board().options(name=board_name(app["model"])).remote() for app in spec["apps"]]
        serve.start(http_options={"host": spec["host"], "port": spec["http_port"]})
        for app in spec["apps"]:  # one application per file, each under its own route
            bound = deployment(app["settings"]).bind(app["file"], app["runtime"], app["model"], app["threads"],
                                                     app["runner_options"], app["tensors"], namespace)
            serve.run(bound, name=app["model"], route_prefix=f"/{app['model']}")
            print(f"SERVING {spec['host']}:{spec['http_port']}/{app['model']}", flush=True)
        stop.wait()
        del boards
        return 0
    finally:
        serve.shutdown()
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    return serve_until_signalled(json.loads(Path(args[0]).read_text()))


if __name__ == "__main__":
    sys.exit(main())

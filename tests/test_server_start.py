"""A model server whose process ends before it is ready is started once more, and a second end is the error
(Ray's own start was seen to fail on a busy machine beside another Ray instance). The server's process is
stood in for by a plain Python process: one that exits at once, or a tiny HTTP server answering 200."""
from __future__ import annotations

import subprocess
import sys

import pytest

from serve_bench.servers.base import ServerError
from serve_bench.servers.deployment import ServedSettings
from serve_bench.servers.ray_serve.server import RayServeServer
from tests.test_server_files import tiny_onnx

ENDS = "raise SystemExit(0)"
ANSWERS = """
import http.server, sys
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
"""


@pytest.mark.parametrize("answers_on, starts", [(2, 2), (3, 2)])
def test_a_server_that_ends_before_it_is_ready_is_started_once_more(tmp_path, monkeypatch, answers_on, starts):
    started = []

    def start(self):
        started.append(1)
        self._folder = tmp_path
        self._log = open(tmp_path / "server.log", "wb")
        code = ANSWERS if len(started) >= answers_on else ENDS
        self._process = subprocess.Popen([sys.executable, "-c", code, str(self.http_port)],
                                         start_new_session=True)
        return self

    monkeypatch.setattr(RayServeServer, "start", start)
    server = RayServeServer(tiny_onnx(tmp_path / "m.onnx"), "onnxruntime", ServedSettings(), model="m")
    try:
        if answers_on <= starts:
            assert server.start().ready(timeout_s=30) is server and server.alive()
        else:
            with pytest.raises(ServerError, match="stopped before it was ready"):
                server.start().ready(timeout_s=30)
        assert len(started) == starts
    finally:
        server.stop()
    assert not server.alive()

"""A client of a served model over HTTP, as a user's service would call it: one keep-alive connection per
thread, one request's tensor as raw bytes, the answer's bytes read back as the server says (shape, dtype).

A refusal is an error that names the server's reason: 400 (the request did not fit the model's input),
503 (the server's queue was full: :class:`Refused`, which load tests count apart), or any other status.
"""
from __future__ import annotations

import http.client
import json
import threading
import urllib.request

import numpy as np

from serve_bench.servers.base import ServerError

TIMEOUT_S = 30.0


class Refused(ServerError):
    """The server turned the request away because its queue was full (HTTP 503): overload, not a fault."""


def get_json(url: str, timeout_s: float = TIMEOUT_S) -> dict:
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        return json.loads(answer.read())


class HttpClient:
    def __init__(self, host: str, port: int, model: str, timeout_s: float = TIMEOUT_S) -> None:
        self.host, self.port, self.model, self.timeout_s = host, port, model, timeout_s
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        return conn

    def metadata(self) -> dict:
        return get_json(f"http://{self.host}:{self.port}/{self.model}", self.timeout_s)

    def _post(self, body: bytes, content_type: str) -> tuple[http.client.HTTPResponse, bytes]:
        for attempt in (0, 1):  # a keep-alive connection the server closed is opened again, once
            conn = self._connection()
            try:
                conn.request("POST", f"/{self.model}/infer", body=body, headers={"Content-Type": content_type})
                answer = conn.getresponse()
                return answer, answer.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                conn.close()
                self._local.conn = None
                if attempt:
                    raise ServerError(f"{self.host}:{self.port} closed the connection: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._local.conn = None
                raise ServerError(f"{self.host}:{self.port}/{self.model}: {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    def infer(self, x: np.ndarray) -> np.ndarray:
        """One request (``x`` without a batch dimension) → its output."""
        answer, body = self._post(np.ascontiguousarray(x).tobytes(), "application/octet-stream")
        if answer.status != 200:
            raise _refusal(answer.status, body)
        shape = json.loads(answer.getheader("X-Output-Shape"))
        return np.frombuffer(body, dtype=np.dtype(answer.getheader("X-Output-Dtype"))).reshape(shape)

    def infer_json(self, inputs: list) -> dict:
        answer, body = self._post(json.dumps({"inputs": inputs}).encode(), "application/json")
        if answer.status != 200:
            raise _refusal(answer.status, body)
        return json.loads(body)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()


def _refusal(status: int, body: bytes) -> ServerError:
    try:
        reason = json.loads(body).get("error") or body.decode(errors="replace")
    except (json.JSONDecodeError, AttributeError):
        reason = body.decode(errors="replace")[:300]
    kind = Refused if status == 503 else ServerError
    error = kind(f"HTTP {status}: {reason}")
    error.status = status
    return error

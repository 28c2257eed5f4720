"""A stand-in for vLLM's control endpoints: records each POST (path, JSON body), answers
``/health`` and ``/weight_info`` (its label moves with ``/update_weight_version``, as vLLM's
does). For tests of what the trainer tells vLLM, not of vLLM (``vllm_server.py`` runs one)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeVllm:
    def __init__(
        self, fail_on: str | None = None, label: str = "default", failures: int | None = None
    ) -> None:
        """``fail_on``: a path answered 500, ``failures`` times (None: always)."""
        calls = self.calls = []
        self.label = label
        self.failures_left = failures
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/health":
                    self._answer(200, {})
                elif self.path == "/weight_info":
                    self._answer(200, {"weight_version": fake.label})
                else:
                    self._answer(404, {"error": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n) or b"null")
                calls.append((self.path, body))
                if self.path == fail_on and fake.failures_left != 0:
                    if fake.failures_left is not None:
                        fake.failures_left -= 1
                    self._answer(500, {})
                    return
                if self.path == "/update_weight_version":
                    fake.label = body["new_version"]
                self._answer(200, {})

            def _answer(self, code: int, body: dict) -> None:
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(body).encode())

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [p for p, _ in self.calls]

    def close(self) -> None:
        self.server.shutdown()

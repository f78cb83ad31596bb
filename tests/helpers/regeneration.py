"""Shared pieces of the regeneration tests (``test_regenerate``, ``test_faults_cli``): the sampling settings they
ask for, a JSONL writer, and scripted HTTP servers that fail on cue (the ``scripted`` fixture in ``conftest.py``
starts them and stops them after the test)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from deepspec_train.regenerate.sampling import SamplingParams

SAMPLING = SamplingParams(temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=6)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


class ScriptedServer(ThreadingHTTPServer):
    """Answers POSTs with the next entry of ``script`` (then 200s), recording each request body. An entry is an
    HTTP status, or raw bytes sent as the body of a 200 (a malformed response)."""

    daemon_threads = True

    def __init__(self, script: list[int | bytes], answer: str) -> None:
        super().__init__(("127.0.0.1", 0), ScriptedHandler)
        self.script, self.answer, self.bodies = list(script), answer, []
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class ScriptedHandler(BaseHTTPRequestHandler):
    server: ScriptedServer

    def log_message(self, format, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.server.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        status = self.server.script.pop(0) if self.server.script else 200
        body = {"choices": [{"message": {"role": "assistant", "content": self.server.answer}}]}
        data = json.dumps(body if status == 200 else {"error": {"message": "scripted"}}).encode()
        if isinstance(status, bytes):
            status, data = 200, status
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

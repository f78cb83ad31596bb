"""A minimal OpenAI-compatible chat-completions server over a local transformers model.

It serves ``POST /v1/chat/completions`` (non-streaming, one choice) and ``GET /v1/models`` with the fields
vLLM and SGLang accept, including ``top_k`` and ``chat_template_kwargs.enable_thinking``. Requests are handled
on threads but generation holds one lock, so answers are produced one at a time: this is a tool for small
models (and the fixture the HTTP regeneration tests run against), not a throughput server. Answers are
reproducible: each request's random stream is seeded from ``--seed`` and the rendered prompt.

Run: ``python -m deepspec_train.regenerate.openai_server --model DIR --port 8000``
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from deepspec_train.regenerate.local_backend import LocalBackend
from deepspec_train.regenerate.sampling import SamplingParams

# OpenAI's defaults for fields a request leaves out; max_tokens has no finite default there, so use a bound
# that a small model's context can hold.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
DEFAULT_MAX_TOKENS = 1024


class RequestError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class ChatCompletionServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], backend: LocalBackend, model_name: str, verbose: bool) -> None:
        super().__init__(address, ChatCompletionHandler)
        self.backend = backend
        self.model_name = model_name
        self.verbose = verbose
        self.created = int(time.time())
        self.generate_lock = threading.Lock()
        self.completions_served = 0

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def sampling_from_request(body: dict[str, Any]) -> SamplingParams:
    """Map OpenAI/vLLM request fields onto ``SamplingParams`` (``top_k`` -1 or 0 means no top-k)."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    top_k = body.get("top_k")
    kwargs = body.get("chat_template_kwargs") or {}
    try:
        return SamplingParams(
            temperature=float(body.get("temperature", DEFAULT_TEMPERATURE)),
            top_p=float(body.get("top_p", DEFAULT_TOP_P)),
            top_k=0 if top_k is None or int(top_k) < 0 else int(top_k),
            max_new_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens),
            enable_thinking=bool(kwargs.get("enable_thinking", True)),
        )
    except (TypeError, ValueError) as exc:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid sampling parameters: {exc}") from None


def validate_messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise RequestError(HTTPStatus.BAD_REQUEST, "'messages' must be a non-empty list")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"messages[{i}] must have a string 'content'")
        if message.get("role") not in ("system", "user", "assistant"):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"messages[{i}] has unsupported role {message.get('role')!r}")
        checked.append({"role": message["role"], "content": message["content"]})
    return checked


class ChatCompletionHandler(BaseHTTPRequestHandler):
    server: ChatCompletionServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def _send_json(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: HTTPStatus, message: str) -> None:
        self._send_json(status, {"error": {"message": message, "type": status.phrase, "code": int(status)}})

    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/v1/models":
            self._send_error(HTTPStatus.NOT_FOUND, f"no route {self.path}")
            return
        model = {
            "id": self.server.model_name,
            "object": "model",
            "created": self.server.created,
            "owned_by": "deepspec_train",
        }
        self._send_json(HTTPStatus.OK, {"object": "list", "data": [model]})

    def do_POST(self) -> None:
        try:
            body = self._read_body()
            if self.path.rstrip("/") != "/v1/chat/completions":
                raise RequestError(HTTPStatus.NOT_FOUND, f"no route {self.path}")
            self._send_json(HTTPStatus.OK, self._chat_completion(body))
        except RequestError as exc:
            self._send_error(exc.status, str(exc))
        except Exception as exc:  # noqa: BLE001 - a server answers every request, even one that broke generation
            self._send_error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")

    def _read_body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        # Always drain the body, even for a request we reject, so a kept-alive connection stays in sync.
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"request body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, "request body must be a JSON object")
        return body

    def _chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        requested = body.get("model")
        if requested not in (None, self.server.model_name):
            raise RequestError(HTTPStatus.NOT_FOUND, f"model {requested!r} is not served here")
        if body.get("stream"):
            raise RequestError(HTTPStatus.BAD_REQUEST, "streaming is not supported by this server")
        if body.get("n", 1) != 1:
            raise RequestError(HTTPStatus.BAD_REQUEST, "only n=1 is supported")
        messages = validate_messages(body.get("messages"))
        sampling = sampling_from_request(body)
        with self.server.generate_lock:
            completion = self.server.backend.complete([messages], sampling)[0]
            self.server.completions_served += 1
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.server.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": completion.text},
                    "finish_reason": completion.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": completion.prompt_tokens,
                "completion_tokens": completion.completion_tokens,
                "total_tokens": completion.prompt_tokens + completion.completion_tokens,
            },
        }


def serve(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 0,
    model_name: str | None = None,
    device: str = "cpu",
    seed: int = 0,
    verbose: bool = False,
) -> tuple[ChatCompletionServer, threading.Thread]:
    """Load the model and serve it on a background thread; ``port=0`` picks a free port (see ``server.url``).
    Stop with ``server.shutdown(); server.server_close()``. The served model name defaults to ``model_path``,
    as in vLLM."""
    backend = LocalBackend(model_path, batch_size=1, device=device, seed=seed)
    server = ChatCompletionServer((host, port), backend, model_name or model_path, verbose)
    thread = threading.Thread(target=server.serve_forever, name="openai-chat-server", daemon=True)
    thread.start()
    return server, thread


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="local model directory (transformers format)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None, help="name clients pass as 'model' (default: --model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="do not log each request")
    args = parser.parse_args(argv)
    server, thread = serve(
        args.model, args.host, args.port, args.served_model_name, args.device, args.seed, verbose=not args.quiet
    )
    print(f"serving {server.model_name} at {server.url}/v1", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

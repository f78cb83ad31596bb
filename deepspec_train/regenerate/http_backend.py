"""Answer conversations through OpenAI-compatible chat-completions servers (vLLM, SGLang, ``openai_server``).

Requests go round-robin over one or more endpoints with up to ``concurrency`` in flight. Connection errors,
timeouts, HTTP 429 and 5xx, and a 200 whose body is not a chat completion (cut off, not JSON, no choices) are
retried with exponential backoff (honouring ``Retry-After``), each retry on the next endpoint so a dead server
does not hold a row back; other HTTP errors (a 400 for a prompt longer than the context, say) fail the row at
once. Endpoint URLs are checked when the backend is made (scheme http or https, a host, a valid port), so a
mistyped one fails at once instead of after its retries. Only the standard library is used.
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from deepspec_train.common.errors import UserError
from deepspec_train.regenerate.backend import GenerationError, Message
from deepspec_train.regenerate.sampling import SamplingParams

CHAT_PATH = "/v1/chat/completions"
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


def check_endpoint(endpoint: str) -> None:
    """Raise ``UserError`` unless ``endpoint`` is an ``http(s)://host[:port][/path]`` URL."""
    parts = urllib.parse.urlsplit(endpoint)
    problem = None
    if parts.scheme not in ("http", "https"):
        problem = "needs the scheme http:// or https://"
    elif not parts.hostname:
        problem = "names no host"
    else:
        try:
            parts.port
        except ValueError as exc:
            problem = f"has an invalid port ({exc})"
    if problem:
        raise UserError(f"endpoint {endpoint!r} {problem}; expected e.g. http://localhost:8000")


def chat_completions_url(endpoint: str) -> str:
    """Accept ``http://host:port``, ``http://host:port/v1`` or the full chat-completions URL."""
    base = endpoint.rstrip("/")
    if base.endswith(CHAT_PATH):
        return base
    if base.endswith("/v1"):
        return base + "/chat/completions"
    return base + CHAT_PATH


def is_retryable_status(status: int) -> bool:
    return status == 429 or status >= 500


class OpenAIChatBackend:
    """``generate`` sends one chat-completions request per conversation and returns the answers (or a
    ``GenerationError`` per conversation that still failed after ``retries`` retries)."""

    batched = False

    def __init__(
        self,
        endpoints: list[str],
        model: str,
        concurrency: int = 16,
        retries: int = 3,
        timeout_s: float = 600.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        api_key: str | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one endpoint is needed")
        if concurrency < 1 or retries < 0:
            raise ValueError(f"need concurrency >= 1 and retries >= 0, got {concurrency} and {retries}")
        for endpoint in endpoints:
            check_endpoint(endpoint)
        self.urls = [chat_completions_url(e) for e in endpoints]
        self.model = model
        self.max_in_flight = concurrency
        self.retries = retries
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.api_key = api_key
        self._turn = itertools.count()
        self._turn_lock = threading.Lock()
        # Proxy settings from the environment are meant for the outside world; a server on this machine must be
        # reached directly even when http_proxy is set.
        self._direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._default = urllib.request.build_opener()

    def _next_url(self) -> str:
        with self._turn_lock:
            return self.urls[next(self._turn) % len(self.urls)]

    def request_body(self, messages: Sequence[Message], sampling: SamplingParams) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": list(messages),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            # vLLM and SGLang read -1 as "no top-k".
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "max_tokens": sampling.max_new_tokens,
            "chat_template_kwargs": {"enable_thinking": sampling.enable_thinking},
        }

    def generate(
        self, conversations: Sequence[Sequence[Message]], sampling: SamplingParams
    ) -> list[str | GenerationError]:
        if len(conversations) == 1:
            return [self._complete_or_error(conversations[0], sampling)]
        with ThreadPoolExecutor(max_workers=min(self.max_in_flight, max(len(conversations), 1))) as pool:
            return list(pool.map(lambda c: self._complete_or_error(c, sampling), conversations))

    def _complete_or_error(self, messages: Sequence[Message], sampling: SamplingParams) -> str | GenerationError:
        try:
            return self.complete(messages, sampling)
        except GenerationError as exc:
            return exc

    def complete(self, messages: Sequence[Message], sampling: SamplingParams) -> str:
        """One answer, retried as described in the module docstring; raises ``GenerationError``."""
        payload = json.dumps(self.request_body(messages, sampling)).encode()
        for attempt in range(self.retries + 1):
            try:
                return parse_answer(self._post(self._next_url(), payload))
            except urllib.error.HTTPError as exc:
                error = GenerationError(f"HTTP {exc.code}", _error_text(exc))
                if not is_retryable_status(exc.code):
                    raise error from None
                retry_after = _retry_after_s(exc)
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as exc:
                reason = getattr(exc, "reason", exc)
                kind = "timeout" if isinstance(reason, TimeoutError) else "connection error"
                error = GenerationError(kind, str(reason))
                retry_after = None
            except GenerationError as exc:
                # A 200 whose body is no chat completion: a server fault (cut-off response, a proxy's page), retried
                # like a 5xx.
                error, retry_after = exc, None
            if attempt < self.retries:
                time.sleep(self._backoff(attempt, retry_after))
        raise error

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        # Jitter spreads the retries of many concurrent requests that failed together (a restarting server).
        delay = self.backoff_s * (2**attempt) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return min(delay, self.max_backoff_s)

    def _post(self, url: str, payload: bytes) -> bytes:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(url, data=payload, headers=headers, method="POST")
        host = urllib.parse.urlsplit(url).hostname
        opener = self._direct if host in LOOPBACK_HOSTS else self._default
        with opener.open(request, timeout=self.timeout_s) as response:
            return response.read()


def parse_answer(raw: bytes) -> str:
    """The assistant text of a chat-completions response. A server that splits the reasoning off (vLLM's
    reasoning parser) returns it as ``reasoning_content``; it is put back in front as a ``<think>`` block so the
    answer reads as the model wrote it."""
    try:
        message = json.loads(raw)["choices"][0]["message"]
        content = message["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise GenerationError("bad response", f"{type(exc).__name__}: {raw[:200]!r}") from None
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise GenerationError("bad response", f"content is {type(content).__name__}")
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        return f"<think>\n{reasoning}\n</think>\n\n{content}"
    return content


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read()[:500].decode(errors="replace")
    except OSError:
        return ""


def _retry_after_s(exc: urllib.error.HTTPError) -> float | None:
    value = exc.headers.get("Retry-After") if exc.headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None

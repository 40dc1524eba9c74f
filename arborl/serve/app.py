"""``arborl serve``: an OpenAI-compatible HTTP server over one arborl checkpoint (FastAPI + uvicorn).

Endpoints:

- ``POST /v1/completions``, ``POST /v1/chat/completions``: OpenAI's bodies (see
  :mod:`arborl.serve.protocol` for the extensions), streamed as server-sent events with
  ``"stream": true`` (``data: {chunk}`` lines, then ``data: [DONE]``).
- ``GET /v1/models``: the one served model. ``GET /health``: status, model, policy version.
- ``POST /update_weights_from_disk`` with ``{"model_path": DIR}``: weight sync (SGLang's
  endpoint name and body), answers ``{"success": true, "policy_version": N}``.

Run it with ``arborl serve CHECKPOINT``, or in-process (tests, notebooks)::

    with PolicyServer(ServedModel("runs/x/policy/rl")) as server:   # a free loopback port
        OpenAI(base_url=server.base_url, api_key="none").completions.create(...)
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from arborl.config import ConfigError
from arborl.policy.chat import TemplateError
from arborl.serve.engine import ServedModel, Step, TextStream, decode_steps
from arborl.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    LoadWeightsRequest,
    SamplingFields,
    chat_logprobs,
    completion_logprobs,
    error_body,
)

DEFAULT_COMPLETION_TOKENS = 16
"""``max_tokens`` of a completions request that leaves it out (OpenAI's default)."""
DEFAULT_CHAT_TOKENS = 256
"""``max_tokens`` of a chat request that leaves it out (less when the context is shorter)."""


@dataclass
class _Sample:
    """One choice: its tokens (stop token included), their log-probs and why it ended."""

    ids: list[int]
    logprobs: list[float]
    tops: list[list[tuple[int, float]]] | None
    finish: str = "length"


@dataclass
class _Job:
    """A validated request, ready to decode."""

    kind: str  # "text_completion" or "chat.completion"
    req: SamplingFields
    prompt_ids: list[int]
    max_new_tokens: int
    stop_ids: list[int]
    top_k: int
    want_logprobs: bool


def _start(served: ServedModel, job: _Job) -> tuple[int, Iterator[Step]]:
    """The policy version and the decoding steps of ``job``, on the weights served when it starts.

    The model and its version are read together under the lock, and the steps keep that model:
    a weight load during the request swaps ``served.model`` for later requests only, so no response
    mixes two versions, and no lock is held while a client reads its stream.
    """
    import torch

    with served.lock:
        model, version = served.model, served.policy_version
    generator = torch.Generator()
    generator.manual_seed(job.req.seed if job.req.seed is not None else int(torch.randint(0, 2**62, (1,))))
    steps = decode_steps(model, job.prompt_ids, n=job.req.n, sampling=job.req.sampling(job.max_new_tokens),
                         generator=generator, stop_ids=job.stop_ids, top_logprobs=job.top_k)
    return version, steps


def _collect(steps: Iterator[Step], job: _Job) -> list[_Sample]:
    rows = [_Sample([], [], [] if job.top_k else None) for _ in range(job.req.n)]
    stop = set(job.stop_ids)
    for step in steps:
        for i, row in enumerate(rows):
            if step.live[i]:
                row.ids.append(step.tokens[i])
                row.logprobs.append(step.logprobs[i])
                if row.tops is not None and step.top is not None:
                    row.tops.append(step.top[i])
                if step.tokens[i] in stop:
                    row.finish = "stop"
    return rows


def _content_ids(sample: _Sample) -> list[int]:
    """The sample's tokens without its stop token (what its text shows)."""
    return sample.ids[:-1] if sample.finish == "stop" else sample.ids


# --- requests -> jobs -------------------------------------------------------------------------
def _job(served: ServedModel, kind: str, req: SamplingFields, prompt_ids: list[int], default_tokens: int,
         top_k: int, want_logprobs: bool) -> _Job:
    req.refuse_unsupported()
    if req.model is not None and req.model != served.name:
        raise LookupError(f"the model {req.model!r} is not served here; this server serves {served.name!r}")
    if not prompt_ids:
        raise ConfigError("the prompt is empty; give at least one token")
    vocab = len(served.tokenizer)
    if any(not 0 <= t < vocab for t in prompt_ids):
        raise ConfigError(f"the prompt has token ids outside the vocabulary [0, {vocab}); tokenize with this model's tokenizer")
    limit = served.max_context_tokens or (len(prompt_ids) + default_tokens)
    max_new = req.max_tokens or getattr(req, "max_completion_tokens", None) or min(default_tokens, limit - len(prompt_ids))
    served.check_length(len(prompt_ids), max(max_new, 1))
    stop_ids = list(req.stop_token_ids) if req.stop_token_ids else list(served.renderer.end_token_ids)
    return _Job(kind, req, list(prompt_ids), max_new, stop_ids, top_k, want_logprobs)


def completion_job(served: ServedModel, req: CompletionRequest) -> _Job:
    """Validate a completions request."""
    if req.echo or req.suffix:
        raise ConfigError("echo and suffix are not supported; leave them out")
    ids = req.prompt if isinstance(req.prompt, list) else served.tokenizer.encode(req.prompt)
    return _job(served, "text_completion", req, list(ids), DEFAULT_COMPLETION_TOKENS, req.logprobs or 0,
                req.logprobs is not None)


def chat_job(served: ServedModel, req: ChatRequest) -> _Job:
    """Validate a chat request and render its messages with the checkpoint's chat template."""
    if req.tools:
        raise ConfigError("tools are not supported by arborl serve; describe the tools in the system message")
    for i, m in enumerate(req.messages):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ConfigError(f"messages[{i}] needs a string role and a string content")
    ids = served.renderer.render_ids(req.messages, generation_prompt=True)
    return _job(served, "chat.completion", req, ids, DEFAULT_CHAT_TOKENS, req.top_logprobs or 0, req.logprobs)


# --- responses --------------------------------------------------------------------------------
def _tokens(served: ServedModel, ids: list[int]) -> list[str]:
    return [str(t) for t in served.tokenizer.convert_ids_to_tokens(ids)]


def _tops(served: ServedModel, tops: list[list[tuple[int, float]]] | None) -> list[list[tuple[str, float]]] | None:
    if tops is None:
        return None
    return [list(zip(_tokens(served, [i for i, _ in row]), [v for _, v in row], strict=True)) for row in tops]


def _choice(served: ServedModel, job: _Job, index: int, s: _Sample) -> dict[str, Any]:
    content = _content_ids(s)
    text = served.tokenizer.decode(content, skip_special_tokens=False)
    choice: dict[str, Any] = {"index": index, "finish_reason": s.finish, "logprobs": None}
    if job.kind == "chat.completion":
        choice["message"] = {"role": "assistant", "content": text}
        if job.want_logprobs:
            choice["logprobs"] = chat_logprobs(_tokens(served, s.ids), s.logprobs, _tops(served, s.tops))
    else:
        choice["text"] = text
        if job.want_logprobs:
            stream = TextStream(served.tokenizer)
            pieces = [stream.push(t) for t in s.ids]
            offsets = [sum(len(p) for p in pieces[:k]) for k in range(len(pieces))]
            choice["logprobs"] = completion_logprobs(_tokens(served, s.ids), s.logprobs, _tops(served, s.tops), offsets)
        if job.req.return_token_ids:
            choice["prompt_token_ids"] = job.prompt_ids
    if job.req.return_token_ids:
        choice["token_ids"] = s.ids
    return choice


def respond(served: ServedModel, job: _Job) -> dict[str, Any]:
    """Generate a whole (non-streamed) response."""
    version, steps = _start(served, job)
    samples = _collect(steps, job)
    body = _head(served, job, version)
    body["choices"] = [_choice(served, job, i, s) for i, s in enumerate(samples)]
    completion = sum(len(s.ids) for s in samples)
    body["usage"] = {"prompt_tokens": len(job.prompt_ids), "completion_tokens": completion,
                     "total_tokens": len(job.prompt_ids) + completion}
    if job.kind == "chat.completion" and job.req.return_token_ids:
        body["prompt_token_ids"] = job.prompt_ids
    return body


def _head(served: ServedModel, job: _Job, version: int, *, chunk: bool = False) -> dict[str, Any]:
    prefix = "chatcmpl" if job.kind == "chat.completion" else "cmpl"
    obj = job.kind + (".chunk" if chunk and job.kind == "chat.completion" else "")
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()), "model": served.name,
            "policy_version": version}


def stream(served: ServedModel, job: _Job) -> Iterator[str]:
    """Server-sent events of a streamed response: one chunk per choice and token, then ``[DONE]``."""
    version, steps = _start(served, job)
    head = _head(served, job, version, chunk=True)
    chat = job.kind == "chat.completion"
    stop = set(job.stop_ids)
    texts = [TextStream(served.tokenizer) for _ in range(job.req.n)]
    open_rows = set(range(job.req.n))
    if chat:
        for i in range(job.req.n):
            first: dict[str, Any] = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                     "finish_reason": None}
            extra = {}
            if job.req.return_token_ids:
                first["token_ids"], extra = [], {"prompt_token_ids": job.prompt_ids}
            yield _event({**head, **extra, "choices": [first]})
    for step in steps:
        for i in sorted(open_rows):
            tok = step.tokens[i]
            finish = "stop" if tok in stop else None
            delta = "" if finish else texts[i].push(tok)
            top = None if step.top is None else [step.top[i]]
            sample = _Sample([tok], [step.logprobs[i]], top, finish or "length")
            yield _event({**head, "choices": [_chunk_choice(served, job, i, sample, delta, finish)]})
            if finish:
                open_rows.discard(i)
    for i in sorted(open_rows):  # cut at max_tokens
        yield _event({**head, "choices": [_chunk_choice(served, job, i, _Sample([], [], None), "", "length")]})
    yield "data: [DONE]\n\n"


def _chunk_choice(served: ServedModel, job: _Job, index: int, s: _Sample, delta: str, finish: str | None) -> dict:
    choice: dict[str, Any] = {"index": index, "finish_reason": finish, "logprobs": None}
    lps = job.want_logprobs and bool(s.ids)
    if job.kind == "chat.completion":
        choice["delta"] = {"content": delta} if s.ids else {}
        if lps:
            choice["logprobs"] = chat_logprobs(_tokens(served, s.ids), s.logprobs, _tops(served, s.tops))
    else:
        choice["text"] = delta
        if lps:
            choice["logprobs"] = completion_logprobs(_tokens(served, s.ids), s.logprobs, _tops(served, s.tops), [0])
    if job.req.return_token_ids:
        choice["token_ids"] = s.ids
    return choice


def _event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


# --- the application --------------------------------------------------------------------------
def create_app(served: ServedModel) -> Any:
    """The FastAPI application serving ``served``."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="arborl serve", docs_url=None, redoc_url=None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        line = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return JSONResponse(status_code=400, content=error_body(line))

    def answer(build: Any, req: Any) -> Any:
        try:
            job = build(served, req)
        except LookupError as e:
            return JSONResponse(status_code=404, content=error_body(e.args[0], "model_not_found"))
        except (ConfigError, TemplateError, ValueError) as e:
            return JSONResponse(status_code=400, content=error_body(str(e)))
        if req.stream:
            return StreamingResponse(stream(served, job), media_type="text/event-stream")
        return JSONResponse(respond(served, job))

    @app.post("/v1/completions")
    def completions(req: CompletionRequest) -> Any:
        return answer(completion_job, req)

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest) -> Any:
        return answer(chat_job, req)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": 0, "owned_by": "arborl",
                                            "max_model_len": served.max_context_tokens,
                                            "policy_version": served.policy_version}]}

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": served.name, "policy_version": served.policy_version, "path": served.path}

    @app.post("/update_weights_from_disk")
    def update_weights(req: LoadWeightsRequest) -> Any:
        try:
            version = served.load(req.model_path, req.policy_version)
        except (ConfigError, FileNotFoundError, ValueError, OSError) as e:
            return JSONResponse(status_code=400, content={"success": False, "message": str(e), **error_body(str(e))})
        return {"success": True, "message": f"loaded {req.model_path}", "policy_version": version}

    return app


class PolicyServer:
    """``arborl serve`` on a loopback port in a background thread; a context manager.

    Args:
        served: The model to serve.
        host: Address to bind.
        port: Port to bind; 0 picks a free one (read back once listening).
        start_timeout: Seconds to wait for the server to accept connections.

    Attributes:
        url: ``http://HOST:PORT`` once started; ``base_url`` adds ``/v1`` (what OpenAI clients take).
    """

    def __init__(self, served: ServedModel, *, host: str = "127.0.0.1", port: int = 0,
                 start_timeout: float = 30.0) -> None:
        self.served, self.host, self.port, self.start_timeout = served, host, port, start_timeout
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI API root, ``URL/v1``."""
        return self.url + "/v1"

    def start(self) -> PolicyServer:
        """Bind, serve in a daemon thread, and wait until it accepts requests.

        Raises:
            ConfigError: the address cannot be bound (in use, not this machine's).
        """
        import uvicorn

        config = uvicorn.Config(create_app(self.served), host=self.host, port=self.port, log_level="warning",
                                access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="arborl-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self._server.started:
            if not self._thread.is_alive():
                self.stop()
                raise ConfigError(f"arborl serve: cannot listen on {self.host}:{self.port}; choose another --port "
                                  "(0 picks a free one) or --host")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"arborl serve did not start within {self.start_timeout} s")
            time.sleep(0.01)
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        """Stop serving (idempotent): ask uvicorn to exit, then force it after 5 s."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(5.0)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(5.0)
        self._server = self._thread = None

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

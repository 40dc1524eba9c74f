"""A rollout policy that samples from OpenAI-compatible generation servers, token-in and token-out.

:class:`HTTPPolicy` sits behind the same :class:`~arborl.rollout.policy.Policy` protocol as the
in-process :class:`~arborl.rollout.policy.ModelPolicy`, so envs, credit and the trainer do not
change. Each turn it sends an episode's whole token history (prompt ids from the chat renderer,
never text) and gets back the sampled ids with their log-probs; the turn it records has the
in-process layout: output ids ending with the end-of-turn token, and a turn cut at the budget
closed with a forced end-of-turn token (mask 0, log-prob 0).

Wire formats (``api``):

``openai`` — ``POST URL/v1/completions`` (``arborl serve``, vLLM): ``prompt`` (token ids),
``max_tokens``, ``temperature`` (0 when greedy), ``top_p``, ``seed``, ``logprobs: 0``,
``return_token_ids: true``, ``stop_token_ids`` (the renderer's end-of-turn ids),
``skip_special_tokens: false``, and ``model`` when configured. Read back: ``choices[0].token_ids``,
``choices[0].logprobs.token_logprobs``, ``choices[0].finish_reason``, ``policy_version`` if the
server reports one. vLLM must be started with ``--logprobs-mode processed_logprobs`` so its
log-probs are those of the temperature-scaled distribution the trainer recomputes (its default
``raw_logprobs`` are at temperature 1), and sampled with ``top_p = 1`` (processed log-probs are
renormalised after top-p, arborl's are not).

``sglang`` — ``POST URL/generate`` (SGLang's native endpoint): ``input_ids``, ``sampling_params``
``{max_new_tokens, temperature, top_p, stop_token_ids, skip_special_tokens: false, sampling_seed}``,
``return_logprob: true``. Read back: ``output_ids`` and ``meta_info.output_token_logprobs``
(``[logprob, token_id, text]`` per token), ``meta_info.finish_reason.type``.

Load balancing and failures. An episode sticks to one server (so that server's prefix cache
holds its history); a new episode goes to the server with the fewest live episodes. A request
that fails (connection error, timeout, 5xx) is retried ``retries`` times, each time on the
least-loaded server that has not failed in the last ``cooldown_s`` seconds; the episode's
history is sent whole, so it continues on another server. When every try fails, the turn records
the error and the episode ends with stop reason ``env_error`` (the trainer's ``rl.error_policy``
decides what the update does with it); the other episodes go on. A 4xx answer is not retried.

Weight sync: :meth:`HTTPPolicy.sync` posts ``{"model_path": DIR, "policy_version": N}`` to
``URL/update_weights_from_disk`` of every server (``arborl serve`` and SGLang). vLLM has no
stable HTTP endpoint that loads weights from disk; point ``sync`` elsewhere or restart it.

Not supported: forced actions (``rl.branch``'s ``forced_ids``) need prompt log-probs, which the
wire formats above do not share; such a turn records an error naming the fix.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from arborl.config import ConfigError
from arborl.policy.chat import ChatRenderer
from arborl.policy.model import save_policy
from arborl.rollout.config import SamplingConfig
from arborl.rollout.generate import TurnOutput, TurnRequest
from arborl.rollout.kvcache import PrefixCache
from arborl.rollout.policy import ModelPolicy, rollout_model

Api = Literal["openai", "sglang"]


class ServerError(RuntimeError):
    """A generation server failed a request; ``retry`` says whether another try may succeed."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass
class Sampled:
    """One server answer: the sampled ids, their log-probs, whether a stop token ended it, the version."""

    ids: list[int]
    logprobs: list[float]
    stopped: bool
    policy_version: int | None = None


class HTTPPolicy:
    """Sample turns from one or more generation servers.

    Args:
        urls: Server roots, e.g. ``["http://127.0.0.1:8000"]`` (no ``/v1``).
        renderer: The chat renderer of the served model's tokenizer.
        api: Wire format, ``openai`` or ``sglang`` (see the module docstring).
        model: ``model`` field of ``openai`` requests (vLLM needs it; ``None`` leaves it out).
        timeout_s: Deadline of one request.
        retries: Further tries of a failed request, on another server when one is up.
        cooldown_s: A server that failed is not picked again for this long (unless none is left).
        max_context_tokens: Longest episode; ``None`` asks the first server (``max_model_len``
            of ``GET /v1/models``), unbounded when it does not say.
        workers: Requests in flight at once (one per live episode, up to this many).
    """

    def __init__(self, urls: list[str], renderer: ChatRenderer, *, api: Api = "openai", model: str | None = None,
                 timeout_s: float = 120.0, retries: int = 2, cooldown_s: float = 5.0,
                 max_context_tokens: int | None = None, workers: int = 16) -> None:
        import httpx

        if not urls:
            raise ValueError("HTTPPolicy needs at least one server URL (policy.urls)")
        if api not in ("openai", "sglang"):
            raise ValueError(f"api is {api!r}; use 'openai' (arborl serve, vLLM) or 'sglang'")
        if retries < 0 or timeout_s <= 0:
            raise ValueError(f"retries ({retries}) must be >= 0 and timeout_s ({timeout_s}) > 0")
        self.urls = [u.rstrip("/") for u in urls]
        self.renderer, self.api, self.model = renderer, api, model
        self.timeout_s, self.retries, self.cooldown_s, self.workers = timeout_s, retries, cooldown_s, workers
        self.client = httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=workers))
        self.versions = [0] * len(self.urls)
        """Per server, the policy version last pushed by :meth:`sync` (reported when the server does not)."""
        self.failures = 0
        """Requests that failed (retried or not) since the policy was built."""
        self.max_context_tokens = max_context_tokens if max_context_tokens is not None else self._ask_context()

    def _ask_context(self) -> int | None:
        try:
            data = self.client.get(self.urls[0] + "/v1/models").json()["data"][0]
        except Exception:  # a server without /v1/models (SGLang's native API): the rollout's own limit applies
            return None
        limit = data.get("max_model_len")
        return int(limit) if isinstance(limit, int) else None

    def open_session(self, sampling: SamplingConfig, generator: torch.Generator,
                     prefix_cache: PrefixCache | None = None) -> HTTPSession:
        """A session over the servers (``prefix_cache`` is ignored: the servers keep their own caches)."""
        return HTTPSession(self, sampling, generator)

    def sync(self, checkpoint_dir: str, policy_version: int) -> None:
        """Make every server load ``checkpoint_dir`` and report ``policy_version`` from now on.

        Raises:
            ServerError: a server refused or could not be reached (the run should not go on with
                stale weights on some servers).
        """
        body = {"model_path": str(checkpoint_dir), "policy_version": int(policy_version)}
        for i, url in enumerate(self.urls):
            try:
                r = self.client.post(url + "/update_weights_from_disk", json=body, timeout=max(self.timeout_s, 600.0))
            except Exception as exc:
                raise ServerError(f"weight sync to {url} failed: {type(exc).__name__}: {exc}", retry=False) from exc
            if r.status_code != 200 or not r.json().get("success", False):
                raise ServerError(f"weight sync to {url} failed ({r.status_code}): {r.text[:300]}", retry=False)
            self.versions[i] = int(policy_version)

    def close(self) -> None:
        """Close the HTTP connections."""
        self.client.close()

    # --- one request ------------------------------------------------------------------------
    def request(self, server: int, ids: list[int], max_new_tokens: int, sampling: SamplingConfig, seed: int) -> Sampled:
        """Sample one turn after ``ids`` on server ``server``.

        Raises:
            ServerError: the request failed (``retry`` False for a 4xx answer).
        """
        url = self.urls[server]
        temperature = 0.0 if sampling.greedy else float(sampling.temperature)
        stop = list(self.renderer.end_token_ids)
        if self.api == "openai":
            path = "/v1/completions"
            body: dict[str, Any] = {"prompt": ids, "max_tokens": max_new_tokens, "temperature": temperature,
                                    "top_p": sampling.top_p, "seed": seed, "logprobs": 0, "n": 1,
                                    "return_token_ids": True, "stop_token_ids": stop, "skip_special_tokens": False}
            if self.model:
                body["model"] = self.model
        else:
            path = "/generate"
            body = {"input_ids": ids, "return_logprob": True,
                    "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature,
                                        "top_p": sampling.top_p, "stop_token_ids": stop,
                                        "skip_special_tokens": False, "sampling_seed": seed}}
        try:
            r = self.client.post(url + path, json=body)
        except Exception as exc:  # connection refused or reset, timeout
            raise ServerError(f"{url}: {type(exc).__name__}: {exc}", retry=True) from exc
        if r.status_code != 200:
            raise ServerError(f"{url} answered {r.status_code}: {r.text[:300]}", retry=r.status_code >= 500)
        try:
            out = _read_openai(r.json()) if self.api == "openai" else _read_sglang(r.json())
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ServerError(f"{url} sent an answer without token ids and log-probs ({exc!r}); "
                              "check policy.http_api and the server flags in docs/serve.md", retry=False) from exc
        out.stopped = bool(out.ids) and out.ids[-1] in stop and out.stopped
        if out.policy_version is None:
            out.policy_version = self.versions[server]
        return out


def _read_openai(body: dict[str, Any]) -> Sampled:
    choice = body["choices"][0]
    ids = [int(t) for t in choice["token_ids"]]
    lps = [float(x) for x in choice["logprobs"]["token_logprobs"]]
    if len(ids) != len(lps):
        raise ValueError(f"{len(ids)} token ids but {len(lps)} log-probs")
    version = body.get("policy_version")
    return Sampled(ids, lps, choice.get("finish_reason") == "stop", int(version) if version is not None else None)


def _read_sglang(body: dict[str, Any]) -> Sampled:
    meta = body["meta_info"]
    pairs = meta["output_token_logprobs"]
    ids = [int(p[1]) for p in pairs]
    lps = [float(p[0]) for p in pairs]
    return Sampled(ids, lps, (meta.get("finish_reason") or {}).get("type") == "stop")


class HTTPSession:
    """Per-``run_episodes`` state: each slot's token history and the server it sticks to."""

    def __init__(self, policy: HTTPPolicy, sampling: SamplingConfig, generator: torch.Generator) -> None:
        self.policy, self.sampling, self.generator = policy, sampling, generator
        self._history: dict[int, list[int]] = {}
        self._server: dict[int, int] = {}
        self._down_until = [0.0] * len(policy.urls)
        self._lock = threading.Lock()

    def generate(self, requests: list[TurnRequest]) -> list[TurnOutput]:
        """One turn for every request, sent concurrently; outputs in request order."""
        jobs = []
        for req in requests:
            history = self._history.setdefault(req.slot, list(req.prefix_ids))
            history += req.prompt_ids
            # one draw per request in request order: the same generator seed gives the same seeds
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))
            jobs.append((req, list(history), seed))
        with ThreadPoolExecutor(max_workers=min(self.policy.workers, len(jobs)) or 1,
                                thread_name_prefix="arborl-http") as pool:
            outs = list(pool.map(lambda job: self._turn(*job), jobs))
        for (req, _, _), out in zip(jobs, outs, strict=True):
            self._history[req.slot] += out.ids
        return outs

    def release(self, slot: int) -> None:
        """The episode in ``slot`` finished: forget its history and its server."""
        self._history.pop(slot, None)
        with self._lock:
            self._server.pop(slot, None)

    def _turn(self, req: TurnRequest, ids: list[int], seed: int) -> TurnOutput:
        if req.forced_ids is not None:
            return TurnOutput(error="the HTTP policy cannot score forced actions (rl.branch); use policy.backend = "
                                    "\"local\" for branch rollouts")
        errors = []
        for _ in range(self.policy.retries + 1):
            server = self._pick(req.slot)
            try:
                got = self.policy.request(server, ids, req.max_new_tokens, self.sampling, seed)
            except ServerError as exc:
                self.policy.failures += 1
                errors.append(str(exc))
                if not exc.retry:
                    break
                self._fail(req.slot, server)
                continue
            return self._output(got)
        return TurnOutput(error="generation failed: " + " | ".join(errors)[-2000:])

    def _output(self, got: Sampled) -> TurnOutput:
        out = TurnOutput(ids=list(got.ids), logprobs=list(got.logprobs), mask=[1] * len(got.ids),
                         policy_version=got.policy_version)
        if not got.stopped:  # cut at the budget: close the turn as the in-process engine does
            out.ids.append(self.policy.renderer.end_token_ids[0])
            out.logprobs.append(0.0)
            out.mask.append(0)
        return out

    def _pick(self, slot: int) -> int:
        """The slot's server; a new slot gets the up server with the fewest live slots (lowest index on ties)."""
        with self._lock:
            if slot in self._server:
                return self._server[slot]
            now = time.monotonic()
            up = [i for i, t in enumerate(self._down_until) if t <= now] or list(range(len(self._down_until)))
            load = {i: 0 for i in up}
            for s in self._server.values():
                if s in load:
                    load[s] += 1
            best = min(up, key=lambda i: (load[i], i))
            self._server[slot] = best
            return best

    def _fail(self, slot: int, server: int) -> None:
        """Mark ``server`` down for the cool-down and un-stick every slot on it."""
        with self._lock:
            self._down_until[server] = time.monotonic() + self.policy.cooldown_s
            for s in [s for s, v in self._server.items() if v == server]:
                del self._server[s]


def rollout_policy(spec: Any, model: Any, tokenizer: Any, version: int, sync_dir: str | Path) -> ModelPolicy | HTTPPolicy:
    """The policy RL rollouts sample from, per ``spec`` (the run's ``policy`` config section).

    ``backend = "local"``: the model in this process (its ``rollout_dtype`` copy, see
    :func:`~arborl.rollout.policy.rollout_model`). ``"http"``: the servers of ``spec.urls``,
    after writing the current weights to ``sync_dir`` and making every server load them as
    ``version`` (the servers must be able to read ``sync_dir``: same machine or a shared disk).

    Raises:
        ConfigError: a server could not be reached or refused the weights.
    """
    renderer = ChatRenderer(tokenizer, spec.system_prompt or None)
    if spec.backend == "local":
        return ModelPolicy(rollout_model(model, spec.rollout_dtype), renderer)
    policy = HTTPPolicy(list(spec.urls), renderer, api=spec.http_api, model=spec.http_model or None,
                        timeout_s=spec.http_timeout_s, retries=spec.http_retries)
    save_policy(model, tokenizer, sync_dir)
    try:
        policy.sync(str(sync_dir), version)
    except ServerError as exc:  # a wrong URL or a server that cannot read the weights: the run cannot start
        policy.close()
        raise ConfigError(f"policy.backend = \"http\": {exc}. Check policy.urls (start servers with `arborl serve "
                          f"CHECKPOINT`) and that every server can read {str(sync_dir)!r}") from None
    return policy

"""A rollout policy on an in-process vLLM engine (``policy.backend = "vllm"``), token-in and token-out.

Optional: vLLM is imported only when this backend is built (``pip install "arborl[vllm]"`` on a
machine with a CUDA GPU; it brings its own torch build). Untested here: the test suite runs on
CPU machines without vLLM and covers only the config rules, the error without vLLM, and the
request building and output reading below, which are pure functions.

Each turn sends an episode's whole token history as ``TokensPrompt(prompt_token_ids=...)`` (never
text) to ``LLM.generate`` with one ``SamplingParams`` per request: ``max_tokens``,
``temperature`` (0 when greedy), ``top_p``, ``seed`` (one draw per request from the run's
generator), ``logprobs=0`` (the sampled token's log-prob only), ``stop_token_ids`` (the renderer's
end-of-turn ids), ``skip_special_tokens=False``. The engine should be built with
``logprobs_mode="processed_logprobs"`` so its log-probs are those of the temperature-scaled
distribution the trainer recomputes (as for vLLM behind the HTTP policy, docs/serve.md). A turn
cut at the budget is closed with a forced end-of-turn token (mask 0, log-prob 0), as in-process.

Weight sync after each update: the trainer's state dict (LoRA merged) is handed to every vLLM
worker through ``LLM.collective_rpc``, which calls the model's own ``load_weights`` (the path
vLLM's RLHF examples use), then ``LLM.reset_prefix_cache()`` so no cached prefix of the old
weights is reused. The engine is built once per run from the first checkpoint it is given.

Not supported: forced actions (``rl.branch``) need prompt log-probs; the config refuses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arborl.config import ConfigError
from arborl.policy.chat import ChatRenderer
from arborl.policy.model import is_lora, merge_lora, save_policy
from arborl.rollout.config import SamplingConfig
from arborl.rollout.generate import TurnOutput, TurnRequest
from arborl.rollout.kvcache import PrefixCache

MISSING = ('policy.backend = "vllm" needs vLLM, which is not installed; install it on a machine with a CUDA GPU '
           '(pip install "arborl[vllm]", it brings its own torch build) or use policy.backend = "local" or "http"')


def sampling_kwargs(sampling: SamplingConfig, *, max_new_tokens: int, stop_ids: list[int], seed: int) -> dict[str, Any]:
    """Keyword arguments of vLLM's ``SamplingParams`` for one turn (the sampled token's log-prob only)."""
    return {"n": 1, "max_tokens": max_new_tokens, "temperature": 0.0 if sampling.greedy else float(sampling.temperature),
            "top_p": float(sampling.top_p), "seed": seed, "logprobs": 0, "stop_token_ids": list(stop_ids),
            "skip_special_tokens": False}


@dataclass
class Completion:
    """What one vLLM completion gave back: sampled ids, their log-probs, whether it stopped on a stop token."""

    ids: list[int]
    logprobs: list[float]
    stopped: bool


def read_completion(output: Any, stop_ids: list[int]) -> Completion:
    """Read ``RequestOutput.outputs[0]`` (``token_ids``, ``logprobs``: one ``{token_id: Logprob}`` per token).

    Raises:
        ValueError: log-probs are missing or do not cover every sampled token.
    """
    ids = [int(t) for t in output.token_ids]
    steps = output.logprobs
    if steps is None or len(steps) != len(ids):
        raise ValueError(f"vLLM returned {len(ids)} tokens but {0 if steps is None else len(steps)} log-prob entries; "
                         "sample with SamplingParams(logprobs=0)")
    lps = [float(step[t].logprob) for step, t in zip(steps, ids, strict=True)]
    return Completion(ids, lps, bool(ids) and ids[-1] in stop_ids and output.finish_reason == "stop")


def close_turn(got: Completion, end_id: int) -> TurnOutput:
    """The recorded turn: sampled tokens (mask 1), plus a forced end-of-turn token when cut at the budget."""
    out = TurnOutput(ids=list(got.ids), logprobs=list(got.logprobs), mask=[1] * len(got.ids))
    if not got.stopped:
        out.ids.append(end_id)
        out.logprobs.append(0.0)
        out.mask.append(0)
    return out


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Run on each vLLM worker by ``collective_rpc``: the model takes the named tensors as a checkpoint's."""
    worker.model_runner.model.load_weights(weights=weights)


class VLLMPolicy:
    """Sample turns from an in-process ``vllm.LLM`` built over the checkpoint in ``model_dir``.

    Args:
        model_dir: a Hugging Face checkpoint directory (written by :func:`arborl.policy.save_policy`).
        renderer: the chat renderer whose end-of-turn ids stop each turn.
        gpu_memory_utilization: the share of GPU memory vLLM may take (weights and KV cache); the
            trainer shares the GPU, so keep it well under 1.

    Raises:
        ConfigError: vLLM is not installed.
    """

    def __init__(self, model_dir: str | Path, renderer: ChatRenderer, *, gpu_memory_utilization: float = 0.4) -> None:
        try:
            import vllm
        except ImportError:
            raise ConfigError(MISSING) from None
        self.renderer = renderer
        self.version = -1
        self._vllm = vllm
        self.llm = vllm.LLM(model=str(model_dir), gpu_memory_utilization=gpu_memory_utilization,
                            enable_prefix_caching=True, logprobs_mode="processed_logprobs")
        self.max_context_tokens = int(self.llm.llm_engine.model_config.max_model_len)

    def open_session(self, sampling: SamplingConfig, generator: torch.Generator,
                     prefix_cache: PrefixCache | None = None) -> VLLMSession:
        """Fresh per-batch state (``prefix_cache`` is ignored: vLLM keeps its own prefix cache)."""
        return VLLMSession(self, sampling, generator)

    def sync(self, model: torch.nn.Module, version: int) -> None:
        """Load ``model``'s weights (LoRA merged) into every vLLM worker as policy ``version``."""
        plain = merge_lora(model) if is_lora(model) else model
        weights = [(k, v.detach()) for k, v in plain.state_dict().items()]
        self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        self.llm.reset_prefix_cache()
        self.version = version

    def generate(self, histories: list[list[int]], params: list[dict[str, Any]]) -> list[Completion]:
        """One completion per history (token ids), all in one ``LLM.generate`` call."""
        prompts = [self._vllm.inputs.TokensPrompt(prompt_token_ids=h) for h in histories]
        outs = self.llm.generate(prompts, [self._vllm.SamplingParams(**p) for p in params], use_tqdm=False)
        stop = list(self.renderer.end_token_ids)
        return [read_completion(o.outputs[0], stop) for o in outs]


class VLLMSession:
    """Per-``run_episodes`` state: each slot's token history."""

    def __init__(self, policy: VLLMPolicy, sampling: SamplingConfig, generator: torch.Generator) -> None:
        self.policy, self.sampling, self.generator = policy, sampling, generator
        self._history: dict[int, list[int]] = {}

    def generate(self, requests: list[TurnRequest]) -> list[TurnOutput]:
        """One turn for every request, batched into one vLLM call; outputs in request order."""
        outs: list[TurnOutput | None] = [None] * len(requests)
        todo, params = [], []
        stop = list(self.policy.renderer.end_token_ids)
        for i, req in enumerate(requests):
            history = self._history.setdefault(req.slot, list(req.prefix_ids))
            history += req.prompt_ids
            if req.forced_ids is not None:
                outs[i] = TurnOutput(error='the vLLM policy cannot score forced actions (rl.branch); use policy.backend '
                                           '= "local" for branch rollouts')
                continue
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))  # one draw per request, in order
            todo.append(i)
            params.append(sampling_kwargs(self.sampling, max_new_tokens=req.max_new_tokens, stop_ids=stop, seed=seed))
        got = self.policy.generate([list(self._history[requests[i].slot]) for i in todo], params) if todo else []
        for i, completion in zip(todo, got, strict=True):
            outs[i] = close_turn(completion, stop[0])
            self._history[requests[i].slot] += outs[i].ids
        return [o for o in outs if o is not None]

    def release(self, slot: int) -> None:
        """The episode in ``slot`` finished: forget its history."""
        self._history.pop(slot, None)


_ENGINES: dict[str, VLLMPolicy] = {}


def vllm_rollout_policy(spec: Any, model: torch.nn.Module, tokenizer: Any, version: int,
                        sync_dir: str | Path) -> VLLMPolicy:
    """The run's vLLM policy (built once, from ``model`` written to ``sync_dir``), holding ``model``'s weights."""
    key = str(Path(sync_dir).resolve())
    policy = _ENGINES.get(key)
    if policy is None:
        save_policy(model, tokenizer, sync_dir)
        policy = VLLMPolicy(sync_dir, ChatRenderer(tokenizer, spec.system_prompt or None),
                            gpu_memory_utilization=spec.vllm_gpu_memory_utilization)
        policy.version = version
        _ENGINES[key] = policy
    if policy.version != version:
        policy.sync(model, version)
    return policy

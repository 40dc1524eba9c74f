"""The model behind ``arborl serve``: one checkpoint, a lock, a policy version, and token-by-token decoding.

:func:`decode_steps` is the decoding loop of the server: it prefills the prompt once for the ``n``
requested samples (``n`` identical rows), then feeds each row its sampled token and draws the next
with :func:`arborl.rollout.sampling.sample_next`, the rollout engine's own sampler. The recorded
log-prob is therefore the engine's convention, ``log_softmax(logits / T)[token]`` under the full
distribution (``T`` the temperature, 1 when greedy; top-p ignored), which the trainer recomputes.

Requests run concurrently on the server's threads, each with its own KV cache, but are not
batched together: the server is for evaluation harnesses, agent frameworks and CPU tests, not
throughput; a serving engine (vLLM, SGLang) is for that. Weight sync (:meth:`ServedModel.load`)
loads the new model first, then swaps it in and bumps :attr:`ServedModel.policy_version` under
a lock; a request reads the model and its version together when it starts and keeps that model,
so no response mixes two versions.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from arborl.config import ConfigError
from arborl.policy.chat import ChatRenderer
from arborl.policy.model import context_length, load_policy, resolve_device
from arborl.rollout.config import SamplingConfig
from arborl.rollout.sampling import sample_next


@dataclass
class Step:
    """One decoding step of every row: the drawn token and its log-prob; ``live`` rows still generate."""

    tokens: list[int]
    logprobs: list[float]
    live: list[bool]
    top: list[list[tuple[int, float]]] | None = None
    """Per row, the ``top_logprobs`` most likely tokens with their log-probs (same convention)."""


@torch.inference_mode()
def decode_steps(
    model: PreTrainedModel,
    prompt_ids: list[int],
    *,
    n: int,
    sampling: SamplingConfig,
    generator: torch.Generator,
    stop_ids: list[int],
    top_logprobs: int = 0,
) -> Iterator[Step]:
    """Sample ``n`` continuations of ``prompt_ids`` together, one :class:`Step` per token.

    A row stops after drawing a token of ``stop_ids`` (that token is its last, ``live`` is True
    at the step that drew it and False afterwards); every row stops after
    ``sampling.max_new_tokens`` tokens.
    """
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([list(prompt_ids)] * n, dtype=torch.long, device=device)  # (n, P)
    logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]  # (n, V)
    stop = torch.tensor(stop_ids, dtype=torch.long, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    for step in range(sampling.max_new_tokens):
        tok, lp = sample_next(logits, sampling, generator)  # (n,), (n,)
        top = None
        if top_logprobs:
            vals, idx = torch.log_softmax(logits.float() / sampling.logprob_temperature, -1).topk(top_logprobs, -1)
            top = [list(zip(i, v, strict=True)) for i, v in zip(idx.tolist(), vals.tolist(), strict=True)]
        yield Step(tokens=tok.tolist(), logprobs=lp.tolist(), live=(~done).tolist(), top=top)
        done = done | torch.isin(tok, stop)
        if bool(done.all()) or step + 1 == sampling.max_new_tokens:
            return
        logits = model(input_ids=tok[:, None], cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]


class ServedModel:
    """A checkpoint loaded for serving, with the policy version the trainer last pushed.

    Args:
        path: Hugging Face checkpoint directory (``save_policy`` output or a downloaded model).
        name: Model id clients pass as ``model`` (default: the directory's name).
        device: ``auto`` (CUDA when present), ``cpu``, ``cuda``, ``cuda:1``...
        policy_version: Version reported until the first weight load.
    """

    def __init__(self, path: str | Path, *, name: str | None = None, device: str = "auto",
                 policy_version: int = 0) -> None:
        self.device = resolve_device(device)
        self.model, self.tokenizer = load_policy(path, device=self.device)
        self.renderer = ChatRenderer(self.tokenizer)
        self.name = name or Path(path).resolve().name
        self.path = str(path)
        self.policy_version = int(policy_version)
        self.lock = threading.Lock()

    @property
    def max_context_tokens(self) -> int | None:
        """Longest sequence the model attends over (``max_position_embeddings``)."""
        return context_length(self.model.config)

    def load(self, path: str | Path, policy_version: int | None = None) -> int:
        """Replace the weights by those of checkpoint ``path``; returns the new policy version.

        The tokenizer must stay the same (token ids in flight would change meaning otherwise).

        Raises:
            ConfigError: the checkpoint's vocabulary differs from the served one.
        """
        model, tok = load_policy(path, device=self.device)
        if tok.get_vocab() != self.tokenizer.get_vocab():
            raise ConfigError(f"checkpoint {str(path)!r} has another vocabulary than the served model; "
                              "weight sync needs the same tokenizer (start a new server for another model)")
        with self.lock:
            self.model = model
            self.path = str(path)
            self.policy_version = self.policy_version + 1 if policy_version is None else int(policy_version)
            return self.policy_version

    def check_length(self, prompt_len: int, max_new_tokens: int) -> None:
        """Raise ConfigError when the prompt plus the token budget exceeds the model's context."""
        limit = self.max_context_tokens
        if limit is not None and prompt_len + max_new_tokens > limit:
            raise ConfigError(f"the prompt has {prompt_len} tokens and max_tokens is {max_new_tokens}: more than the "
                              f"model's context of {limit} tokens; shorten the prompt or lower max_tokens")


class TextStream:
    """Incremental detokenization of one row: :meth:`push` returns the text a new token adds.

    The text of ``ids[:k]`` is decoded whole each time (a token's text can depend on its
    neighbours, e.g. byte-level pieces of one character), and the new suffix is returned.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def push(self, token: int) -> str:
        """Add ``token``; the text it appends (empty while it is an incomplete character)."""
        self.ids.append(int(token))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        if text.endswith("\ufffd"):  # an unfinished multi-byte character: wait for the next piece
            return ""
        delta = text[len(self.text):] if text.startswith(self.text) else text
        self.text = text
        return delta

"""Request bodies of ``arborl serve`` (OpenAI's, with vLLM's token-id extensions) and the response pieces.

Field names follow OpenAI's Completions and Chat Completions APIs; the extensions carry vLLM's
names, so one client request works against ``arborl serve`` and vLLM alike: ``prompt`` as a list
of token ids, ``return_token_ids`` (``token_ids`` per choice, ``prompt_token_ids`` per choice for
completions and at the top for chat), ``stop_token_ids``. Every response (and stream chunk) also
carries ``policy_version``. Options that would change what is sampled and are not implemented
(``stop`` strings, ``echo``, ``suffix``, ``logit_bias``, penalties, ``tools``) are refused with a
400, never ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr

from arborl.config import ConfigError
from arborl.rollout.config import SamplingConfig

MAX_N = 16
"""Most samples one request may ask for."""


class SamplingFields(BaseModel):
    """The fields completions and chat requests share."""

    model: str | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: StrictInt = Field(default=1, ge=1, le=MAX_N)
    seed: StrictInt | None = None
    stream: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None
    return_token_ids: StrictBool = False
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def refuse_unsupported(self) -> None:
        """Raise ConfigError for an option this server would otherwise ignore."""
        if self.stop:
            raise ConfigError("stop strings are not supported; pass stop_token_ids (token ids that end a sample)")
        if self.logit_bias or self.presence_penalty or self.frequency_penalty:
            raise ConfigError("logit_bias and presence/frequency penalties are not supported; leave them out")

    def sampling(self, max_new_tokens: int) -> SamplingConfig:
        """The engine's sampling settings: temperature 0 is greedy decoding (log-probs at temperature 1)."""
        greedy = self.temperature == 0.0
        return SamplingConfig(temperature=1.0 if greedy else self.temperature, top_p=self.top_p,
                              max_new_tokens=max_new_tokens, greedy=greedy)


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: ``prompt`` is text or a list of token ids."""

    prompt: StrictStr | list[StrictInt]
    logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    echo: StrictBool = False
    suffix: str | None = None


class ChatRequest(SamplingFields):
    """``POST /v1/chat/completions``: ``messages`` rendered with the checkpoint's chat template."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    tools: list[Any] | None = None


class LoadWeightsRequest(BaseModel):
    """``POST /update_weights_from_disk`` (SGLang's name and body): load a checkpoint directory."""

    model_path: StrictStr
    policy_version: StrictInt | None = None
    """The version to report from now on (default: the current one plus 1)."""


def completion_logprobs(tokens: list[str], logprobs: list[float], tops: list[list[tuple[str, float]]] | None,
                        offsets: list[int]) -> dict[str, Any]:
    """The ``logprobs`` object of a completions choice (OpenAI's legacy layout)."""
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": None if tops is None else [dict(t) for t in tops],
        "text_offset": offsets,
    }


def chat_logprobs(tokens: list[str], logprobs: list[float], tops: list[list[tuple[str, float]]] | None) -> dict:
    """The ``logprobs`` object of a chat choice: one entry per token, with its bytes and alternatives."""
    def entry(tok: str, lp: float) -> dict[str, Any]:
        return {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8"))}

    content = []
    for k, (tok, lp) in enumerate(zip(tokens, logprobs, strict=True)):
        alts = [] if tops is None else [entry(t, v) for t, v in tops[k]]
        content.append({**entry(tok, lp), "top_logprobs": alts})
    return {"content": content}


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error object (the ``openai`` client raises it as ``BadRequestError`` & co.)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}

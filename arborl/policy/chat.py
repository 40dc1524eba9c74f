"""Per-turn token ids from a tokenizer's own chat template.

A multi-turn episode is one growing token sequence. The rollout feeds it to the model in pieces
(turn 0: system + first user message + assistant header; every later turn: whatever the template
puts after the assistant's end-of-turn token, the next user message, the assistant header), and
the model writes ``response + end-of-turn token`` in between. :class:`ChatRenderer` derives each
piece by rendering message lists with ``tokenizer.apply_chat_template`` and taking token
*suffixes*, so the concatenation of the pieces equals the tokenization of the full rendered
conversation for any prefix-stable template (the tiny word-level template, ChatML as used by
Qwen2.5, Llama 3, ...). A template that rewrites earlier turns when a new message is appended
(e.g. one that strips reasoning from past assistant turns) is not prefix-stable and is refused
with :class:`TemplateError`.

Later turns are rendered after a fixed one-turn reference history rather than the episode's
real history: the delta a prefix-stable template appends for a new user message does not depend
on the content of earlier messages, and a short reference keeps rendering cost constant.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

Messages = list[dict[str, Any]]
Observation = str | Messages
"""What an environment's ``format_observation`` returns: user-message text or chat messages."""

_PROBE_USER = "x"
_PROBE_ASSISTANT = "y"
MEMO_SIZE = 8192
"""Rendered text observations and responses a :class:`ChatRenderer` remembers (then it starts afresh)."""


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be rendered turn by turn; the message says why."""


def observation_text(obs: Observation) -> str:
    """Human-readable text of an observation (message contents joined by newlines)."""
    if isinstance(obs, str):
        return obs
    return "\n".join(_content_text(m.get("content", "")) for m in obs)


def _content_text(content: Any) -> str:
    """A message's text; a multimodal part list (``{"type": "text"|"image", ...}``) reads ``<image>`` for an image."""
    if not isinstance(content, list):
        return str(content)
    return " ".join(str(p.get("text", "")) if p.get("type") == "text" else "<image>" for p in content
                    if isinstance(p, dict))


class ChatRenderer:
    """Token ids of each turn's prompt and of assistant responses, from the chat template.

    Args:
        tokenizer: A tokenizer with a ``chat_template``.
        system_prompt: System message put before the first user message (``None``: none, or
            whatever default the template inserts).

    Attributes:
        end_token_ids: Token ids that end an assistant turn during generation; the first is the
            template's end-of-turn token, appended when a response is cut off.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, system_prompt: str | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                "the tokenizer has no chat_template; load an instruct/chat checkpoint or set "
                "tokenizer.chat_template (arborl.policy.train_tokenizer sets one)"
            )
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        # (kind, text) -> ids: rendering is a pure function of the text, and rollouts render the same
        # observations again and again (group members share a start, branches re-play visited states)
        self._memo: dict[tuple[str, str], tuple[int, ...]] = {}
        self._ask = self._render([{"role": "user", "content": _PROBE_USER}], generation_prompt=True)
        # The assistant turn of an empty response is exactly the end-of-turn segment, e.g.
        # [<|im_end|>, "\n"] for ChatML or [<|end|>] for the word-level template.
        self._close = self._assistant_span("")
        if not self._close:
            raise TemplateError("the chat template renders nothing after an assistant message; it has no end-of-turn token")
        stop = self._close[0]
        special = set(tokenizer.all_special_ids) | {
            i for i, t in tokenizer.added_tokens_decoder.items() if getattr(t, "special", False)
        }
        if stop not in special:
            raise TemplateError(
                f"the chat template ends an assistant message with token {tokenizer.convert_ids_to_tokens(stop)!r}, "
                "which is not a special token; generation could not stop on it. Use a template whose assistant "
                "turn ends with a special end-of-turn token"
            )
        eos = tokenizer.eos_token_id
        self.end_token_ids: list[int] = [stop] + ([eos] if eos is not None and eos != stop else [])
        self._reference = self._render(
            [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ASSISTANT}],
            generation_prompt=False,
        )

    # --- public -----------------------------------------------------------------------------
    def first_prompt(self, obs: Observation) -> list[int]:
        """System prompt + first user message(s) + assistant generation header."""
        return self._memoized("first", obs, lambda: self._render(_as_messages(obs), generation_prompt=True))

    def next_prompt(self, obs: Observation) -> list[int]:
        """Tokens that follow the model's end-of-turn token: template tail, user message, header."""
        return self._memoized("next", obs, lambda: self._next_prompt(obs))

    def _next_prompt(self, obs: Observation) -> list[int]:
        full = self._render(
            [
                {"role": "user", "content": _PROBE_USER},
                {"role": "assistant", "content": _PROBE_ASSISTANT},
                *_as_messages(obs),
            ],
            generation_prompt=True,
        )
        self._check_prefix(self._reference, full, "appending a user message")
        return self._close[1:] + full[len(self._reference):]

    def encode_response(self, text: str) -> list[int]:
        """Token ids the model would have to generate to answer ``text``: content + end token."""
        return self._memoized("response", text, lambda: self._encode_response(text))

    def _encode_response(self, text: str) -> list[int]:
        span = self._assistant_span(text)
        tail = self._close[1:]
        if tail and span[-len(tail):] != tail:
            raise TemplateError(
                f"the assistant turn for {text!r} does not end with the template's end-of-turn tokens; the "
                "template is not prefix-stable for this text"
            )
        return span[: len(span) - len(tail)]

    def render_ids(self, messages: Messages, *, generation_prompt: bool) -> list[int]:
        """Token ids of a full rendered conversation (system prompt added as in ``first_prompt``)."""
        return self._render(messages, generation_prompt=generation_prompt)

    def decode(self, ids: list[int]) -> str:
        """Text of generated ids, without trailing end-of-turn tokens."""
        end = set(self.end_token_ids)
        n = len(ids)
        while n and ids[n - 1] in end:
            n -= 1
        return self.tokenizer.decode(ids[:n], skip_special_tokens=False)

    # --- internals --------------------------------------------------------------------------
    def _memoized(self, kind: str, obs: Observation, render: Any) -> list[int]:
        """``render()`` for a text ``obs``, remembered; message lists are rendered every time."""
        if not isinstance(obs, str):
            return render()
        key = (kind, obs)
        ids = self._memo.get(key)
        if ids is None:
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            ids = self._memo[key] = tuple(render())
        return list(ids)

    def _render(self, messages: Messages, *, generation_prompt: bool) -> list[int]:
        if self.system_prompt is not None and not (messages and messages[0].get("role") == "system"):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        if not isinstance(text, str):
            raise TemplateError(f"apply_chat_template returned {type(text).__name__}, expected text")
        # The template writes any BOS token itself; adding special tokens again would double it.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _assistant_span(self, text: str) -> list[int]:
        full = self._render(
            [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": text}],
            generation_prompt=False,
        )
        self._check_prefix(self._ask, full, "adding an assistant message")
        return full[len(self._ask):]

    def _check_prefix(self, prefix: list[int], full: list[int], what: str) -> None:
        if full[: len(prefix)] != prefix:
            raise TemplateError(
                f"the chat template is not prefix-stable: {what} changes earlier tokens, so turns cannot be fed "
                "incrementally. Use a template whose rendering of a conversation only appends tokens"
            )


def _as_messages(obs: Observation) -> Messages:
    if isinstance(obs, str):
        return [{"role": "user", "content": obs}]
    if not isinstance(obs, list) or not all(isinstance(m, dict) and "role" in m for m in obs):
        raise TypeError(
            f"an observation must be a str or a list of chat messages ({{'role': ..., 'content': ...}}), "
            f"got {type(obs).__name__}"
        )
    return list(obs)

"""A word-level tokenizer trained on environment text, with a chat template.

The tiny policies arborl trains from scratch read short, regular environment text (grid maps,
action words, a system prompt), so a word-level vocabulary is enough and keeps the model small.
Words are split on whitespace only (``WhitespaceSplit``): a word such as ``<answer>Up</answer>``
stays one token, so an action the environment parses round-trips through ``decode`` unchanged.
Decoding joins tokens with single spaces, so a round trip normalises whitespace.

Special tokens take the first ids, in this order: ``<|pad|>`` 0, ``<|unk|>`` 1, ``<|system|>`` 2,
``<|user|>`` 3, ``<|assistant|>`` 4, ``<|end|>`` 5 (the end-of-turn and eos token).

The chat template renders each message as ``<|role|> content <|end|>`` and the generation
prompt as ``<|assistant|>``; after whitespace splitting, the assistant turn the model must write
is ``content <|end|>``.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, UNK, SYSTEM, USER, ASSISTANT, END = (
    "<|pad|>",
    "<|unk|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
)
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, SYSTEM, USER, ASSISTANT, END)
"""Special tokens, in id order (ids 0..5)."""

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('role ' ~ message['role'] ~ ' is not supported; use system, user or assistant') }}"
    "{%- endif -%}"
    "<|{{ message['role'] }}|> {{ message['content'] }} <|end|> "
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
"""Jinja chat template of the word-level tokenizer (whitespace between parts is cosmetic)."""


def train_tokenizer(corpus: Iterable[str], *, extra_words: Iterable[str] = ()) -> PreTrainedTokenizerFast:
    """Train a word-level tokenizer on environment text.

    Args:
        corpus: Texts the policy will read or write: observations, action texts, system prompt.
            Must not contain the special tokens (they would be learnt as words).
        extra_words: Words added to the vocabulary even if absent from ``corpus`` (e.g. every
            legal action text).

    Returns:
        A fast tokenizer with ``eos_token="<|end|>"``, ``pad_token="<|pad|>"``,
        ``unk_token="<|unk|>"`` and :data:`CHAT_TEMPLATE` as its chat template.

    Raises:
        ValueError: if the corpus contains a special token, or the trained ids are not
            contiguous ``0..vocab_size-1``.
    """
    texts = [*corpus, *(w for w in extra_words)]
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"corpus item {i} is a {type(text).__name__}; pass strings only")
        for special in SPECIAL_TOKENS:
            # The trainer gives a special token seen in the text a second, fresh id, leaving a
            # hole in the id range; refuse such text instead.
            if special in text:
                raise ValueError(
                    f"corpus item {i} contains the special token {special!r}; remove special tokens from "
                    "the training text (the chat template adds them)"
                )
    if not any(t.split() for t in texts):
        raise ValueError("the corpus has no words; pass observation, action and system-prompt texts")
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS), min_frequency=1)
    tok.train_from_iterator(texts, trainer=trainer)
    vocab = tok.get_vocab()
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError(f"trained token ids are not contiguous 0..{len(vocab) - 1}; check the corpus")
    for i, special in enumerate(SPECIAL_TOKENS):
        if vocab.get(special) != i:
            raise ValueError(f"special token {special!r} got id {vocab.get(special)}, expected {i}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=END, pad_token=PAD, unk_token=UNK)
    fast.chat_template = CHAT_TEMPLATE
    return fast

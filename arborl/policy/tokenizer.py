"""Tokenizers trained on environment text, with a chat template: word-level or byte-level BPE.

The tiny policies arborl trains from scratch read short, regular environment text (grid maps,
action words, a system prompt), so a word-level vocabulary is enough and keeps the model small.
Words are split on whitespace only (``WhitespaceSplit``): a word such as ``<answer>Up</answer>``
stays one token, so an action the environment parses round-trips through ``decode`` unchanged.
Decoding joins tokens with single spaces, so a round trip normalises whitespace.

``kind="bpe"`` trains a byte-level BPE instead, for text whose words are not a closed set (the
names of a generated world): a word never seen in training is made of pieces that are, so the
policy can copy it as a run of trained tokens. Text is cut before the merges (:data:`BPE_SPLIT`)
into an XML-style tag (``<search>``, `` </answer>``), a run of letters, a single digit (each digit
is its own piece: a year is four tokens, so numbers share pieces), a run of other symbols or of
whitespace, each with at most one leading whitespace character; merges never cross these cuts.
Every byte has a token, so nothing is unknown, and ``decode(encode(text)) == text`` exactly.

Special tokens take the first ids in both, in this order: ``<|pad|>`` 0, ``<|unk|>`` 1,
``<|system|>`` 2, ``<|user|>`` 3, ``<|assistant|>`` 4, ``<|end|>`` 5 (the end-of-turn and eos token).

The chat template renders each message as ``<|role|> content <|end|>`` and the generation
prompt as ``<|assistant|>``; the assistant turn the model must write is ``content <|end|>``. The
word-level template puts spaces between the parts (whitespace splitting drops them); the BPE one
(:data:`BPE_CHAT_TEMPLATE`) does not, since a BPE keeps every space as text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
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

BPE_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('role ' ~ message['role'] ~ ' is not supported; use system, user or assistant') }}"
    "{%- endif -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
"""Jinja chat template of the BPE tokenizer: :data:`CHAT_TEMPLATE`'s parts with nothing between them."""

BPE_SPLIT = r"\s?</?[A-Za-z_]+>|\s?\p{L}+|\s?\p{N}|\s?[^\s\p{L}\p{N}]+|\s+"
"""Pre-tokenization pattern of the BPE tokenizer: tag, letters, one digit, symbols, whitespace."""

TokenizerKind = Literal["word", "bpe"]


def train_tokenizer(corpus: Iterable[str], *, extra_words: Iterable[str] = (), kind: TokenizerKind = "word",
                    vocab_size: int = 2000) -> PreTrainedTokenizerFast:
    """Train a word-level or byte-level BPE tokenizer on environment text.

    Args:
        corpus: Texts the policy will read or write: observations, action texts, system prompt.
            Must not contain the special tokens (they would be learnt as words).
        extra_words: Words added to the vocabulary even if absent from ``corpus`` (e.g. every
            legal action text); a BPE trains on each, after a space, as more text.
        kind: ``"word"`` (one token per whitespace-separated word) or ``"bpe"`` (byte-level BPE).
        vocab_size: ``kind="bpe"``: the most tokens, specials and the 256 byte tokens included
            (fewer when the corpus has fewer merges to learn). Ignored for ``"word"``.

    Returns:
        A fast tokenizer with ``eos_token="<|end|>"``, ``pad_token="<|pad|>"``,
        ``unk_token="<|unk|>"`` and :data:`CHAT_TEMPLATE` (word) or :data:`BPE_CHAT_TEMPLATE`
        (bpe) as its chat template.

    Raises:
        ValueError: if the corpus contains a special token or no words, ``kind`` or
            ``vocab_size`` is invalid, or the trained ids are not contiguous ``0..vocab_size-1``.
    """
    words = [*extra_words]
    texts = [*corpus, *words]
    _check_corpus(texts)
    if kind == "word":
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.train_from_iterator(texts, trainer=trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS),
                                                                         min_frequency=1))
        template = CHAT_TEMPLATE
    elif kind == "bpe":
        # a word inside a text follows a space: train the extra words in that form, so their pieces
        # are the ones the text is cut into (``" Dredour"``, not ``"Dredour"``)
        tok = _train_bpe([*corpus, *(" " + w for w in words)], vocab_size)
        template = BPE_CHAT_TEMPLATE
    else:
        raise ValueError(f"tokenizer kind {kind!r} is unknown; use 'word' or 'bpe'")
    vocab = tok.get_vocab()
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError(f"trained token ids are not contiguous 0..{len(vocab) - 1}; check the corpus")
    for i, special in enumerate(SPECIAL_TOKENS):
        if vocab.get(special) != i:
            raise ValueError(f"special token {special!r} got id {vocab.get(special)}, expected {i}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=END, pad_token=PAD, unk_token=UNK,
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = template
    return fast


def _check_corpus(texts: list[str]) -> None:
    """Refuse non-strings, special tokens and a corpus without a word."""
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


def _train_bpe(texts: list[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE over :data:`BPE_SPLIT` pieces, specials first, then the 256 bytes, then merges."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    smallest = len(SPECIAL_TOKENS) + len(alphabet)
    if vocab_size < smallest:
        raise ValueError(f"BPE vocab_size is {vocab_size}; use at least {smallest} (the specials and the 256 byte "
                         "tokens) and more for merges, e.g. 2000")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(BPE_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok

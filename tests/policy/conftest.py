"""Locally built tokenizers for policy tests: the word-level one and a ChatML (Qwen2-style) BPE."""

from __future__ import annotations

import json
from collections.abc import Iterable

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

from arborl.policy import train_tokenizer

CORPUS = [
    "you are an agent on a frozen lake",
    "map : F F H G | P F F F . your move ?",
    "<answer>left</answer> <answer>right</answer> <answer>up</answer> <answer>down</answer>",
]

# A ChatML template in the style of Qwen2.5's: a default system message when none is given,
# "<|im_start|>role\ncontent<|im_end|>\n" per message, "<|im_start|>assistant\n" to generate.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="session")
def word_tokenizer() -> PreTrainedTokenizerFast:
    return train_tokenizer(CORPUS)


def qwen2_tokenizer(texts: Iterable[str], *, vocab_size: int, chat_template: str) -> Qwen2Tokenizer:
    """A ``Qwen2Tokenizer`` (the class transformers loads for every qwen2 checkpoint) with a
    byte-level BPE vocabulary trained on ``texts`` and ChatML special tokens."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(list(texts), trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = Qwen2Tokenizer(vocab=model["vocab"], merges=merges, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = chat_template
    return tok


@pytest.fixture(scope="session")
def chatml_tokenizer() -> Qwen2Tokenizer:
    texts = [*CORPUS, "system user assistant You are a helpful assistant.\n"] * 3
    return qwen2_tokenizer(texts, vocab_size=400, chat_template=CHATML_TEMPLATE)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared CPU the threads' barriers
    make every small op wait for a descheduled thread (measured 10x slower under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

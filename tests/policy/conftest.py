"""Locally built tokenizers for policy tests: the word-level one and a ChatML (Qwen2-style) BPE."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

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


@pytest.fixture(scope="session")
def chatml_tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator([*CORPUS, "system user assistant You are a helpful assistant.\n"] * 3, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML_TEMPLATE
    return tok


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared CPU the threads' barriers
    make every small op wait for a descheduled thread (measured 10x slower under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

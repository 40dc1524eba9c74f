"""The word-level tokenizer: contiguous ids, fixed special ids, chat template round trip."""

from __future__ import annotations

import pytest

from arborl.policy import SPECIAL_TOKENS, train_tokenizer


def test_ids_are_contiguous_and_specials_come_first(word_tokenizer):
    vocab = word_tokenizer.get_vocab()
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert len(word_tokenizer) == len(vocab)
    assert [vocab[s] for s in SPECIAL_TOKENS] == [0, 1, 2, 3, 4, 5]
    assert word_tokenizer.pad_token_id == 0
    assert word_tokenizer.unk_token_id == 1
    assert word_tokenizer.eos_token_id == 5


def test_vocabulary_is_exactly_the_corpus_words_plus_specials():
    tok = train_tokenizer(["a b b", "c"], extra_words=["<answer>up</answer>"])
    words = set(tok.get_vocab()) - set(SPECIAL_TOKENS)
    assert words == {"a", "b", "c", "<answer>up</answer>"}
    assert len(tok) == len(SPECIAL_TOKENS) + 4


def test_special_token_in_corpus_is_refused():
    with pytest.raises(ValueError, match="special token '<\\|end\\|>'"):
        train_tokenizer(["hello <|end|> world"])


def test_empty_corpus_is_refused():
    with pytest.raises(ValueError, match="no words"):
        train_tokenizer(["  ", ""])


def test_whole_words_round_trip_and_unknown_words_map_to_unk(word_tokenizer):
    text = "map : F H  G <answer>left</answer>"
    ids = word_tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 6  # whitespace split only: the tagged action stays one token
    assert word_tokenizer.decode(ids) == " ".join(text.split())
    assert word_tokenizer.encode("zebra F", add_special_tokens=False)[0] == word_tokenizer.unk_token_id


def test_chat_template_renders_roles_and_generation_prompt(word_tokenizer):
    messages = [
        {"role": "system", "content": "you are an agent"},
        {"role": "user", "content": "your move ?"},
        {"role": "assistant", "content": "<answer>up</answer>"},
        {"role": "user", "content": "map : F"},
    ]
    ids = word_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    tokens = word_tokenizer.convert_ids_to_tokens(word_tokenizer.encode(ids, add_special_tokens=False))
    assert tokens == [
        "<|system|>", "you", "are", "an", "agent", "<|end|>",
        "<|user|>", "your", "move", "?", "<|end|>",
        "<|assistant|>", "<answer>up</answer>", "<|end|>",
        "<|user|>", "map", ":", "F", "<|end|>",
        "<|assistant|>",
    ]
    text = word_tokenizer.decode(word_tokenizer.encode(ids, add_special_tokens=False))
    assert text == " ".join(ids.split())


def test_chat_template_refuses_unknown_roles(word_tokenizer):
    with pytest.raises(Exception, match="role tool is not supported"):
        word_tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)

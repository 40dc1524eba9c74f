"""The byte-level BPE scratch tokenizer: specials, hand-checked pieces, exact round trips, portability."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from arborl.config import ConfigError, load_config
from arborl.env.envs.frozenlake import ACTIONS
from arborl.policy import (
    SPECIAL_TOKENS,
    ChatRenderer,
    ModelConfig,
    build_model,
    load_policy,
    save_policy,
    train_tokenizer,
)
from arborl.policy.portable import stock_tokenizer_problem
from arborl.search.corpus import CorpusConfig, generate
from arborl.train.config import TrainConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from clikit import arborl, sets  # noqa: E402

CORPUS = [
    "Who founded Dredour Dynamics ?",
    "<search> Dredour Dynamics </search>",
    "Dredour Dynamics was founded in 1981 by Dario Brolkalbra .",
    "<answer> Dario Brolkalbra </answer>",
    "Where was Dario Brolkalbra born ? in 1944 and 2008",
]


@pytest.fixture(scope="module")
def bpe():
    return train_tokenizer(CORPUS * 3, kind="bpe", vocab_size=400)


def pieces(tok, text: str) -> list[str]:
    return tok.convert_ids_to_tokens(tok.encode(text, add_special_tokens=False))


def test_specials_take_ids_0_to_5_then_the_256_bytes(bpe):
    vocab = bpe.get_vocab()
    assert [vocab[s] for s in SPECIAL_TOKENS] == [0, 1, 2, 3, 4, 5]
    assert sorted(vocab.values()) == list(range(len(vocab))) and len(vocab) <= 400
    assert (bpe.pad_token_id, bpe.unk_token_id, bpe.eos_token_id) == (0, 1, 5)
    assert bpe.convert_ids_to_tokens(6) == "!" and bpe.convert_ids_to_tokens(261) == "Ń"  # byte 0x21 first ... 256 byte tokens
    assert all(sum(c.isdigit() for c in t) <= 1 for t in vocab)  # no merge joins two digits


def test_hand_checked_pieces(bpe):
    # a tag is one piece, a word keeps its leading space ("Ġ"), the tag after a word too
    assert pieces(bpe, "<search> Dredour Dynamics </search>") == ["<search>", "ĠDredour", "ĠDynamics", "Ġ</search>"]
    # digits one by one: the first takes the space before it
    assert pieces(bpe, " in 1981") == ["Ġin", "Ġ1", "9", "8", "1"]
    # an unseen word is made of bytes and learnt pieces, never <|unk|>
    assert pieces(bpe, " Dredwhy") == ["ĠD", "red", "w", "h", "y"]  # merges: ĠD, red, redour, ĠDredour; no "Dred"
    assert bpe.unk_token_id not in bpe.encode("zebra ñ 🦓", add_special_tokens=False)


@pytest.mark.parametrize("text", [
    "<search> Dredour Dynamics founded </search>",
    "<answer> Dario Brolkalbra </answer>",
    "<answer>Dario Brolkalbra</answer>",
    "<search>Beirdmourd Group CEO</search>",
    "<answer> 1944 </answer>",
    *ACTIONS,
    *(f"<answer>{a}</answer>" for a in ACTIONS),
    "???",
    "  two  spaces\tand\na newline ",
    "Zoë's café, 42 % — ok?",
])
def test_decode_of_encode_is_the_text_exactly(bpe, text):
    ids = bpe.encode(text, add_special_tokens=False)
    assert bpe.decode(ids) == text
    assert bpe.decode(ids, skip_special_tokens=True) == text


def test_chat_template_renders_roles_without_spaces_and_the_renderer_round_trips(bpe):
    messages = [
        {"role": "system", "content": "Search ."},
        {"role": "user", "content": "Who founded Dredour Dynamics ?"},
        {"role": "assistant", "content": "<search> Dredour Dynamics </search>"},
        {"role": "user", "content": "in 1981"},
    ]
    text = bpe.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|system|>Search .<|end|><|user|>Who founded Dredour Dynamics ?<|end|>"
                    "<|assistant|><search> Dredour Dynamics </search><|end|><|user|>in 1981<|end|><|assistant|>")
    renderer = ChatRenderer(bpe, "Search .")
    action = "<search> Dredour Dynamics </search>"
    turns = renderer.first_prompt(messages[1]["content"]) + renderer.encode_response(action) + renderer.next_prompt("in 1981")
    assert turns == bpe.encode(text, add_special_tokens=False)
    response = renderer.encode_response(action)
    assert response[-1] == bpe.eos_token_id and renderer.decode(response) == action


def test_checkpoint_loads_as_a_plain_hf_tokenizer(bpe, tmp_path):
    model = build_model(ModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32),
                        bpe, seed=0)
    save_policy(model, bpe, tmp_path)
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert stock_tokenizer_problem(bpe, model.config.model_type) is None
    stock = AutoTokenizer.from_pretrained(tmp_path)
    _, ours = load_policy(tmp_path)
    text = "<|user|>Who founded Dredour Dynamics ?<|end|><|assistant|><answer> Dario Brolkalbra </answer><|end|>"
    assert stock.encode(text, add_special_tokens=False) == bpe.encode(text, add_special_tokens=False)
    assert stock.decode(stock.encode(text, add_special_tokens=False)) == text
    assert ours.chat_template == stock.chat_template == bpe.chat_template


def test_bad_kind_and_vocab_size_are_refused():
    with pytest.raises(ValueError, match="tokenizer kind 'sentencepiece' is unknown; use 'word' or 'bpe'"):
        train_tokenizer(CORPUS, kind="sentencepiece")
    with pytest.raises(ValueError, match="BPE vocab_size is 100; use at least 262"):
        train_tokenizer(CORPUS, kind="bpe", vocab_size=100)
    with pytest.raises(ConfigError, match="policy.tokenizer_vocab_size is 200; a BPE needs at least 262"):
        load_config(TrainConfig, None, ['policy.tokenizer="bpe"', "policy.tokenizer_vocab_size=200"])
    with pytest.raises(ConfigError, match="policy.tokenizer"):
        load_config(TrainConfig, None, ['policy.tokenizer="chars"'])


def test_a_held_out_name_is_made_of_pieces_the_training_text_holds_many_times():
    """Word-level: a held-out subject is a token no training text holds; BPE: every piece of it is frequent there."""
    passages, questions = generate(CorpusConfig())
    by_id = {p.id: p for p in passages}
    train = [q for q in questions if q.split == "train"]
    train_text = [q.question for q in train] + [by_id[pid].text for q in train for pid in q.supporting_ids]
    words = sorted({w for p in passages for w in p.text.split()})  # the env's vocabulary: every word
    bpe = train_tokenizer(train_text[:200], extra_words=words, kind="bpe", vocab_size=2000)
    word = train_tokenizer(train_text[:200], extra_words=words)
    seen_words = {w for t in train_text for w in t.split()}
    counts: dict[int, int] = {}
    for t in train_text:
        for i in bpe.encode(t, add_special_tokens=False):
            counts[i] = counts.get(i, 0) + 1
    held = [q for q in questions if q.split == "test"]
    names = {by_id[q.supporting_ids[0]].title for q in held} - {by_id[pid].title for q in train for pid in q.supporting_ids}
    unseen = sorted(n for n in names if not set(n.split()) & seen_words)  # no word of it in any training text
    assert len(unseen) > 50
    seen_per_piece = []
    for name in unseen:
        ids = bpe.encode(" " + name, add_special_tokens=False)
        assert len(ids) > len(name.split())  # pieces, not one token a word
        assert min(counts.get(i, 0) for i in ids) >= 1, (name, bpe.convert_ids_to_tokens(ids))
        seen_per_piece += [counts[i] for i in ids]
        assert all(w in word.get_vocab() and w not in seen_words for w in name.split())  # the word-level contrast
    assert sorted(seen_per_piece)[len(seen_per_piece) // 2] >= 50  # a typical piece: in dozens of training texts


@pytest.mark.slow  # 31 s on a 2-core AVX2 host
def test_train_and_eval_checkpoint_through_the_cli_with_the_bpe_tokenizer(tmp_path):
    run = tmp_path / "run"
    extra = ['policy.tokenizer="bpe"', "policy.tokenizer_vocab_size=300", 'stages=["synth","sft","eval"]']
    arborl("train", "examples/frozenlake.toml", *sets(run, extra))
    ckpt = run / "policy" / "sft"
    assert json.loads((ckpt / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert len(AutoTokenizer.from_pretrained(ckpt)) <= 300
    p = arborl("eval", "examples/frozenlake.toml", "--checkpoint", str(ckpt), *sets(tmp_path / "ev", extra))
    got = json.loads((tmp_path / "ev" / "summary.json").read_text())["checkpoint"]
    summary = json.loads((run / "summary.json").read_text())
    assert "checkpoint" in p.stdout and got == summary["sft"]  # same held-out tasks, greedy: the same numbers

"""A checkpoint arborl writes is read by plain transformers exactly as arborl reads it.

The policy is built the way ``arborl train`` builds it (``prepare_policy`` on the demo config,
shrunk), then loaded with nothing but ``AutoTokenizer`` and ``AutoModelForCausalLM``: the chat
template must render the same token ids arborl's rollout fed, and greedy ``generate`` must write
the same tokens arborl's own greedy rollout wrote, turn after turn, on held-out maps.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

from arborl.config import load_config
from arborl.policy import (
    ChatRenderer,
    CheckpointError,
    ModelConfig,
    build_model,
    load_policy,
    save_policy,
)
from arborl.rollout import ModelPolicy, run_episodes
from arborl.train.common import env_factory
from arborl.train.config import TrainConfig
from arborl.train.stages import prepare_policy, specs_for

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64, max_position_embeddings=256)
TINY_POLICY = [
    "policy.tokenizer_episodes=40", "policy.model.hidden_size=32", "policy.model.num_layers=1",
    "policy.model.num_heads=2", "policy.model.num_kv_heads=2", "policy.model.intermediate_size=64",
    "rollout.max_turns=3",
]


@pytest.fixture(scope="module")
def demo_policy(tmp_path_factory):
    """The demo's initial policy, as ``arborl train examples/frozenlake.toml`` writes it (shrunk)."""
    run = tmp_path_factory.mktemp("run")
    cfg = load_config(TrainConfig, "examples/frozenlake.toml", [f'run_dir="{run}"', *TINY_POLICY])
    make_env = env_factory(cfg.env)
    return cfg, make_env, prepare_policy(cfg, make_env)


def _arborl_greedy(cfg, make_env, path, seeds):
    model, tok = load_policy(path)
    renderer = ChatRenderer(tok, cfg.policy.system_prompt or None)
    rcfg = replace(cfg.rollout, sampling=replace(cfg.rollout.sampling, greedy=True))
    specs = specs_for(cfg, "frozenlake", seeds, group_prefix="heldout")
    return run_episodes(ModelPolicy(model, renderer), make_env, specs, rcfg, generator=torch.Generator().manual_seed(0))


def test_plain_transformers_reproduces_arborl_greedy_episodes(demo_policy):
    cfg, make_env, path = demo_policy
    seeds = [cfg.env.eval_seed_start + k for k in range(4)]
    episodes = _arborl_greedy(cfg, make_env, path, seeds)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    system = [{"role": "system", "content": cfg.policy.system_prompt}] if cfg.policy.system_prompt else []
    compared = 0
    for ep in episodes:
        messages, fed = list(system), []
        for turn in ep.path():
            messages.append({"role": "user", "content": turn.observation})
            # What plain transformers renders for the conversation so far is what arborl fed.
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            fed += turn.prompt_ids
            assert list(ids) == fed, f"seed {ep.seed} turn {turn.index}: the stock tokenizer renders other ids"
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=cfg.rollout.sampling.max_new_tokens)
            sampled = [t for t, m in zip(turn.output_ids, turn.output_mask, strict=True) if m]
            assert out[0, len(ids):].tolist() == sampled, f"seed {ep.seed} turn {turn.index}: another greedy action"
            fed += turn.output_ids
            messages.append({"role": "assistant", "content": turn.action_text})
            compared += 1
    assert compared >= len(seeds)
    # One token per map word (rows unseen by a 40-episode tokenizer are <|unk|>, as in arborl).
    obs = episodes[0].path()[0].observation
    assert len(tok.tokenize(obs)) == len(obs.split()) == 8


def test_stock_tokenizer_files_carry_template_and_special_tokens(demo_policy):
    _, _, path = demo_policy
    tok = AutoTokenizer.from_pretrained(path)
    _, ours = load_policy(path)
    assert type(tok).__name__ == type(ours).__name__
    assert tok.get_vocab() == ours.get_vocab()
    assert (tok.eos_token, tok.pad_token, tok.unk_token) == ("<|end|>", "<|pad|>", "<|unk|>")
    assert tok.chat_template == ours.chat_template
    config = json.loads((path / "config.json").read_text())
    assert (config["eos_token_id"], config["pad_token_id"]) == (tok.eos_token_id, tok.pad_token_id)


def test_a_policy_stock_loaders_would_misread_is_refused(word_tokenizer):
    # transformers loads every qwen2 checkpoint with Qwen2Tokenizer (a byte-level BPE rebuilt from
    # the vocabulary), which drops the words of a word-level tokenizer.
    with pytest.raises(CheckpointError, match="arch = 'llama'"):
        build_model(ModelConfig(arch="qwen2", **SMALL), word_tokenizer, seed=0)


def test_save_policy_refuses_and_writes_nothing(tmp_path, word_tokenizer):
    out = tmp_path / "ckpt"
    with pytest.raises(CheckpointError, match="Qwen2Tokenizer"):
        save_policy(_as_qwen2(word_tokenizer), word_tokenizer, out)
    assert not out.exists()


def _as_qwen2(tokenizer):
    """A qwen2 model sized to the tokenizer, built without build_model's check."""
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id)
    return Qwen2ForCausalLM(cfg)


def test_a_real_qwen2_tokenizer_keeps_the_qwen2_architecture(tmp_path):
    vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyzĠ")}, "ab": 28}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[("a", "b")], eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    model = build_model(ModelConfig(arch="qwen2", **SMALL), tok, seed=0)
    save_policy(model, tok, tmp_path)
    stock = AutoTokenizer.from_pretrained(tmp_path)
    text = tok.apply_chat_template([{"role": "user", "content": "ab cab"}], tokenize=False, add_generation_prompt=True)
    assert stock.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)


def test_legacy_qwen2_word_level_checkpoint_still_loads_in_arborl(tmp_path, word_tokenizer):
    # What arborl wrote before: a qwen2 model beside the word-level tokenizer, saved as is.
    model = _as_qwen2(word_tokenizer)
    model.save_pretrained(tmp_path)
    word_tokenizer.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="plain transformers"):
        _, tok = load_policy(tmp_path)
    text = "your move ? <answer>left</answer>"
    assert tok.encode(text, add_special_tokens=False) == word_tokenizer.encode(text, add_special_tokens=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointError, match="Qwen2Tokenizer"):
            save_policy(load_policy(tmp_path)[0], tok, tmp_path / "again")

"""A checkpoint arborl writes is read by plain transformers exactly as arborl reads it.

The policy is the demo's, trained and saved by ``arborl train`` itself (synth and a short SFT,
shrunk), then loaded with nothing but ``AutoTokenizer`` and ``AutoModelForCausalLM``: the chat
template must render the same token ids arborl's rollout fed, and greedy ``generate`` must write
the same tokens arborl's own greedy rollout wrote, turn after turn, on held-out maps.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

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
from arborl.train.stages import specs_for

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64, max_position_embeddings=256)
ROOT = Path(__file__).resolve().parents[2]
# Enough cold start for greedy actions that depend on the map (measured: all four actions, about
# half the held-out maps solved), in about 30 s on a shared CPU.
SHORT_SFT = [
    'stages=["synth","sft"]', "synth.episodes=300", "sft.steps=200", "sft.eval_every=0",
    "policy.tokenizer_episodes=100", "policy.model.hidden_size=64", "policy.model.num_heads=2",
    "policy.model.num_kv_heads=2", "policy.model.intermediate_size=128", "threads=1",
]


@pytest.fixture(scope="module")
def demo_policy(tmp_path_factory):
    """The demo's policy after a short cold start, written by ``arborl train`` itself."""
    run = tmp_path_factory.mktemp("portable") / "run"
    args = [a for kv in [f'run_dir="{run}"', *SHORT_SFT] for a in ("--set", kv)]
    p = subprocess.run([sys.executable, "-m", "arborl.cli", "train", "examples/frozenlake.toml", *args],
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env={"ARBORL_PROGRESS": "0", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stdout + p.stderr
    cfg = load_config(TrainConfig, "examples/frozenlake.toml", [f'run_dir="{run}"', *SHORT_SFT, "rollout.max_turns=4"])
    return cfg, env_factory(cfg.env), run / "policy" / "sft"


def _arborl_greedy(cfg, make_env, path, seeds):
    model, tok = load_policy(path)
    renderer = ChatRenderer(tok, cfg.policy.system_prompt or None)
    rcfg = replace(cfg.rollout, sampling=replace(cfg.rollout.sampling, greedy=True))
    specs = specs_for(cfg, "frozenlake", seeds, group_prefix="heldout")
    return run_episodes(ModelPolicy(model, renderer), make_env, specs, rcfg, generator=torch.Generator().manual_seed(0))


@pytest.mark.slow  # shares the module's demo run: ~40 s on a 2-core AVX2 host
def test_plain_transformers_reproduces_arborl_greedy_episodes(demo_policy):
    cfg, make_env, path = demo_policy
    seeds = [cfg.env.eval_seed_start + k for k in range(12)]
    episodes = _arborl_greedy(cfg, make_env, path, seeds)
    actions = [t.action_text for e in episodes for t in e.path()]
    # The comparison must be informative: greedy actions that depend on the map.
    assert len({a for a in actions if a in ("Left", "Down", "Right", "Up")}) >= 3 and any(e.success for e in episodes)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    system = [{"role": "system", "content": cfg.policy.system_prompt}] if cfg.policy.system_prompt else []
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
            assert tok.decode(out[0, len(ids):], skip_special_tokens=True) == turn.action_text
            fed += turn.output_ids
            messages.append({"role": "assistant", "content": turn.action_text})
    obs = episodes[0].path()[0].observation
    assert len(tok.tokenize(obs)) == len(obs.split()) == 8  # one token per map word


@pytest.mark.slow  # shares the module's demo run: ~40 s on a 2-core AVX2 host
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
    # transformers 4.x (still pinned by serving stacks) does not know the name "TokenizersBackend".
    assert json.loads((path / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_a_policy_stock_loaders_would_misread_is_refused(word_tokenizer):
    # transformers loads every qwen2 checkpoint with Qwen2Tokenizer (a byte-level BPE rebuilt from
    # the vocabulary), which drops the words of a word-level tokenizer.
    with pytest.raises(CheckpointError, match=r"as Qwen2Tokenizer, whose model differs .*WordLevel.* saved, BPE.*arch = 'llama'"):
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

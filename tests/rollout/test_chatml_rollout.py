"""The engine on a ChatML (Qwen2-style) template and BPE tokenizer with a tiny Qwen2 model.

Nothing in the rollout may assume the word-level tokenizer: here the end-of-turn token
``<|im_end|>`` is followed by a template newline that arrives with the next prompt.
"""

from __future__ import annotations

import pytest
import torch

from arborl.policy import ChatRenderer, ModelConfig, build_model, token_logprobs
from arborl.rollout import EpisodeSpec, ModelPolicy, RolloutConfig, SamplingConfig, run_episodes
from arborl.trajectory.schema import linearize
from tests.policy.conftest import qwen2_tokenizer

from .conftest import SYSTEM, WORDS, CountEnv

CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def chatml():
    tok = qwen2_tokenizer([SYSTEM, " ".join(WORDS), "system user assistant 0123456789"] * 3, vocab_size=300,
                          chat_template=CHATML)
    model = build_model(ModelConfig(arch="qwen2", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                    intermediate_size=128, max_position_embeddings=1024), tok, seed=0)
    return ChatRenderer(tok, SYSTEM), model


def _run(renderer, model, *, reuse: bool, greedy: bool):
    specs = [EpisodeSpec(f"t{i}", "count", "g", seed=i, options={"length": n}) for i, n in enumerate([3, 2, 3])]
    cfg = RolloutConfig(max_turns=4, sampling=SamplingConfig(max_new_tokens=5, greedy=greedy, temperature=0.8))
    return run_episodes(ModelPolicy(model, renderer, reuse_cache=reuse), CountEnv, specs, cfg,
                        generator=torch.Generator().manual_seed(0))


def test_chatml_rollout_logprobs_and_cache(chatml):
    renderer, model = chatml
    eps = _run(renderer, model, reuse=True, greedy=False)
    newline_after_end = renderer.next_prompt("x")[0]
    for ep in eps:
        view = linearize(ep)
        with torch.no_grad():
            lp = token_logprobs(model, torch.tensor([view.input_ids]), temperature=0.8)[0]
        m = torch.tensor(view.loss_mask, dtype=torch.bool)
        assert (lp[m] - torch.tensor(view.logprobs)[m]).abs().max() < 1e-4
        for turn in ep.turns[1:]:
            assert turn.prompt_ids[0] == newline_after_end  # the template's "\n" after <|im_end|>
    greedy_kept = _run(renderer, model, reuse=True, greedy=True)
    greedy_fresh = _run(renderer, model, reuse=False, greedy=True)
    assert [[t.output_ids for t in e.turns] for e in greedy_kept] == [[t.output_ids for t in e.turns] for e in greedy_fresh]

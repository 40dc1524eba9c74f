"""ToolEnv under the real rollout: Turn.tool_call on every parsed call, and tool results never trained on.

The gradient test is the foundation's masked-token invariant (tests/loss/test_losses.py) on a
real multi-turn rollout: a scripted policy calls a calculator and a stateful notebook through
a ChatML template and a byte-level BPE tokenizer, the episodes go through ``collate`` and the
trainer's own log-prob function and loss, and every logit that predicts a tool-result token
must get exactly zero gradient.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from arborl.env import Task, ToolEnv
from arborl.loss import ppo_clip_loss, sft_loss
from arborl.policy import ChatRenderer, ModelConfig, build_model, token_logprobs_and_entropy
from arborl.rollout import (
    EpisodeSpec,
    ModelPolicy,
    RolloutConfig,
    SamplingConfig,
    ScriptedPolicy,
    run_episodes,
)
from arborl.tools import CALCULATOR
from arborl.tools.metrics import tool_metrics
from arborl.train.batch import collate
from arborl.trajectory.schema import ToolCall, linearize
from tests.policy.conftest import CHATML_TEMPLATE, qwen2_tokenizer

from .test_tool_env import Notebook, Sleeper, exact

TASKS = [Task("What is 17 * 23?", answer="391", id="mul", metadata={"expr": "17 * 23"}),
         Task("What is 2 ** 10?", answer="1024", id="pow", metadata={"expr": "2 ** 10"})]


def call(name: str, **arguments: Any) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def script(env) -> str:
    """Compute, take a note, answer; the seed-1 task also makes one slow and one malformed call."""
    task, k = env.unwrapped.task, env.unwrapped.steps
    plan = [call("calculator", expression=task.metadata["expr"]), call("notebook", line=f"result of {task.id}")]
    if task.id == "pow":
        plan += [call("sleep", s=2), '<tool_call>{"name": "calculator"</tool_call>']
    plan.append(f"<answer>{task.answer}</answer>")
    return plan[k]


@pytest.fixture(scope="module")
def chatml():
    tok = qwen2_tokenizer(["tool_call tool_response answer calculator notebook 0123456789 expression"] * 3,
                          vocab_size=300, chat_template=CHATML_TEMPLATE)
    model = build_model(ModelConfig(arch="qwen2", hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                                    intermediate_size=64, max_position_embeddings=4096), tok, seed=0)
    return ChatRenderer(tok), model


def _rollout(renderer, policy=None, **kw):
    nb = Notebook()
    specs = [EpisodeSpec(task_id=t.id, task_type="tool", group_id="g", seed=i) for i, t in enumerate(TASKS)]
    cfg = RolloutConfig(max_turns=8, max_context_tokens=4096, sampling=SamplingConfig(max_new_tokens=kw.pop("tokens", 8)))
    eps = run_episodes(policy or ScriptedPolicy(script, renderer),
                       lambda: ToolEnv(TASKS, [CALCULATOR, nb, Sleeper()], exact, call_timeout_s=0.3), specs, cfg,
                       generator=torch.Generator().manual_seed(0))
    return eps, nb


def test_rollout_records_tool_calls_latency_errors_and_releases_every_instance(chatml):
    renderer, _ = chatml
    (mul, pow_), nb = _rollout(renderer)
    assert [t.tool_call for t in mul.turns] == [
        ToolCall("calculator", {"expression": "17 * 23"}, "call_1_0"),
        ToolCall("notebook", {"line": "result of mul"}, "call_2_0"),
        None,
    ]
    assert [t.result for t in mul.turns[:2]] == ["<tool_response>\n391\n</tool_response>",
                                                 "<tool_response>\nresult of mul\n</tool_response>"]
    assert all(t.timings["tool"] >= 0 for t in mul.turns[:2]) and "tool" not in mul.turns[2].timings
    assert mul.stop_reason == "terminated" and mul.rewards["success"] == 1.0
    slow, bad = pow_.turns[2], pow_.turns[3]
    assert slow.tool_call == ToolCall("sleep", {"s": 2}, "call_3_0") and slow.valid
    assert slow.error == "sleep: TimeoutError: sleep did not answer within 0.3 s"
    assert slow.info["tool_stats"] == {"sleep": {"calls": 1, "errors": 1, "timeouts": 1}}
    assert 0.3 <= slow.timings["tool"] < 1.5
    assert not bad.valid and bad.tool_call is None and "is not valid JSON" in bad.error
    assert pow_.stop_reason == "terminated" and pow_.rewards["success"] == 1.0
    assert len(nb.created) == 2 and len(nb.released) == 2
    for ep in (mul, pow_):
        ep.validate()
    # 5 calls ran (the malformed one did not): calculator and notebook twice, sleep once and timed out
    got = tool_metrics([mul, pow_])
    turns = mul.turns + pow_.turns
    # the 0.3 s timeout dominates the tools' time; the share is over every turn's generate + env seconds
    assert got.pop("tools/time_share") == pytest.approx(
        sum(t.timings.get("tool", 0) for t in turns) / sum(t.timings["generate"] + t.timings["env"] for t in turns))
    assert got == {
        "tools/calculator/calls": 2.0, "tools/calculator/errors": 0.0, "tools/calculator/timeouts": 0.0,
        "tools/notebook/calls": 2.0, "tools/notebook/errors": 0.0, "tools/notebook/timeouts": 0.0,
        "tools/sleep/calls": 1.0, "tools/sleep/errors": 1.0, "tools/sleep/timeouts": 1.0,
        "tools/calls_per_episode": 2.5,
    }
    assert tool_metrics([]) == {"tools/calls_per_episode": 0.0, "tools/time_share": 0.0}


def test_an_untrained_model_sampling_garbage_never_stops_the_rollout(chatml):
    renderer, model = chatml
    eps, nb = _rollout(renderer, ModelPolicy(model, renderer), tokens=12)
    assert [(ep.stop_reason, len(ep.turns)) for ep in eps] == [("truncated", 8)] * 2  # the env's max_steps
    assert all(not t.valid and t.error for ep in eps for t in ep.turns)
    assert nb.created == []


def test_every_tool_result_token_gets_exactly_zero_gradient(chatml):
    renderer, model = chatml
    eps, _ = _rollout(renderer)
    batch = collate(eps)
    # Locate each tool result in the token sequence: the prompt ids of the turn after a call.
    result_positions: list[tuple[int, int]] = []
    for b, ep in enumerate(eps):
        view, k = linearize(ep), 0
        for turn in ep.turns:
            text = renderer.tokenizer.decode(turn.prompt_ids)
            if turn.index > 0 and "<tool_response>" in text:
                result_positions += [(b, k + i) for i in range(len(turn.prompt_ids))]
            k += len(turn.prompt_ids) + len(turn.output_ids)
        assert k == len(view.input_ids)
    assert len(result_positions) > 40
    assert "\n391\n</tool_response>" in renderer.tokenizer.decode(eps[0].turns[1].prompt_ids)

    captured: dict[str, torch.Tensor] = {}

    def keep(module, inputs, output):
        output.retain_grad()
        captured["logits"] = output

    handle = model.lm_head.register_forward_hook(keep)
    try:
        model.train()
        logp, ent = token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask)
    finally:
        handle.remove()
        model.eval()
    adv = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(0)) * batch.loss_mask
    out = ppo_clip_loss(logp, batch.old_logp, adv, batch.loss_mask, ref_logp=logp.detach() - 0.1, kl_coef=0.1,
                        entropy=ent, entropy_coef=0.01)
    (out.loss + sft_loss(logp, batch.loss_mask).loss).backward()
    g = captured["logits"].grad  # (B, T, V); logits at t-1 predict token t
    grad_of_token = torch.zeros(batch.loss_mask.shape)
    grad_of_token[:, 1:] = g[:, :-1].abs().sum(-1)
    for b, t in result_positions:
        assert batch.loss_mask[b, t] == 0
        assert grad_of_token[b, t] == 0.0, (b, t)
    assert torch.count_nonzero(grad_of_token[batch.loss_mask == 0]) == 0
    assert torch.count_nonzero(grad_of_token[batch.loss_mask == 1]) == int(batch.loss_mask.sum())

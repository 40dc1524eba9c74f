"""arborl serve through the official openai client: token ids, log-probs, streaming, errors, weight sync."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch

from arborl.policy import ChatRenderer, load_policy, token_logprobs
from arborl.rollout import ModelPolicy, SamplingConfig
from arborl.rollout.generate import TurnRequest

PROMPT = [2, 7, 8, 9, 4]  # token ids: <|system|> ... <|assistant|>
IDS = {"return_token_ids": True}


def recomputed(checkpoint, prompt, output, temperature):
    """The trainer's log-probs of ``output`` after ``prompt`` (one full forward pass)."""
    model, _ = load_policy(checkpoint)
    with torch.no_grad():
        lp = token_logprobs(model, torch.tensor([prompt + output]), temperature=temperature)[0]
    return lp[len(prompt):].tolist()


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_completion_logprobs_equal_the_trainers_recomputed_logprobs(client, checkpoint, temperature):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=temperature, seed=3,
                                  logprobs=0, extra_body=IDS)
    (choice,) = r.choices
    ids = choice.token_ids
    assert choice.prompt_token_ids == PROMPT and len(ids) == len(choice.logprobs.token_logprobs) >= 1
    expected = recomputed(checkpoint, PROMPT, ids, temperature)
    assert max(abs(a - b) for a, b in zip(choice.logprobs.token_logprobs, expected, strict=True)) < 1e-4
    assert r.usage.completion_tokens == len(ids) and r.usage.prompt_tokens == len(PROMPT)
    assert r.policy_version == 0


def test_greedy_completion_is_the_in_process_engines_greedy_turn(client, checkpoint, tokenizer):
    model, _ = load_policy(checkpoint)
    renderer = ChatRenderer(tokenizer)
    session = ModelPolicy(model, renderer).open_session(SamplingConfig(greedy=True, max_new_tokens=10),
                                                        torch.Generator().manual_seed(0))
    (out,) = session.generate([TurnRequest(slot=0, prompt_ids=PROMPT, max_new_tokens=10)])
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, temperature=0, logprobs=0, extra_body=IDS)
    ids = r.choices[0].token_ids
    trained = [i for i, m in zip(out.ids, out.mask, strict=True) if m]  # the engine adds a forced end when cut
    assert ids == trained
    assert r.choices[0].finish_reason == ("stop" if out.mask[-1] else "length")
    assert r.choices[0].logprobs.token_logprobs == pytest.approx(out.logprobs[: len(ids)], abs=1e-5)


def test_same_seed_same_samples_and_n_rows_differ(client):
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=8, seed=11, n=3, extra_body=IDS)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in a.choices}) > 1  # three rows, three draws


def test_stream_gives_the_same_tokens_and_text_as_one_response(client):
    kw = dict(model="tiny", prompt="go left now", max_tokens=8, seed=5, logprobs=0, extra_body=IDS)
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(stream=True, **kw))
    ids = [t for c in chunks for t in c.choices[0].token_ids]
    lps = [lp for c in chunks if c.choices[0].logprobs for lp in c.choices[0].logprobs.token_logprobs]
    assert ids == whole.token_ids and lps == whole.logprobs.token_logprobs
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_chat_renders_the_template_and_stops_at_the_end_of_turn(client, tokenizer):
    messages = [{"role": "system", "content": "you are an agent"}, {"role": "user", "content": "go left"}]
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, seed=2, logprobs=True,
                                       top_logprobs=2, extra_body=IDS)
    renderer = ChatRenderer(tokenizer)
    assert r.prompt_token_ids == renderer.render_ids(messages, generation_prompt=True)
    choice = r.choices[0]
    ids = choice.token_ids
    if choice.finish_reason == "stop":
        assert ids[-1] in renderer.end_token_ids
    assert choice.message.content == renderer.decode(ids)
    assert [e.token for e in choice.logprobs.content] == tokenizer.convert_ids_to_tokens(ids)
    for e in choice.logprobs.content:  # the top alternatives are sorted and at least as likely as the draw
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, seed=2,
                                                 stream=True, extra_body=IDS))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert [t for c in chunks for t in (c.choices[0].token_ids or [])] == ids


def test_models_and_health(client, server):
    (m,) = client.models.list().data
    assert m.id == "tiny" and m.policy_version == 0 and m.max_model_len == 256
    assert httpx.get(server.url + "/health").json() == {"status": "ok", "model": "tiny", "policy_version": 0,
                                                        "path": str(server.served.path)}


@pytest.mark.parametrize(("kw", "error", "words"), [
    ({"model": "gpt-4"}, openai.NotFoundError, "serves 'tiny'"),
    ({"stop": ["left"]}, openai.BadRequestError, "stop_token_ids"),
    ({"prompt": [2, 10_000]}, openai.BadRequestError, "outside the vocabulary"),
    ({"max_tokens": 300}, openai.BadRequestError, "context of 256"),
    ({"top_p": 0}, openai.BadRequestError, "top_p"),
    ({"echo": True}, openai.BadRequestError, "echo"),
])
def test_bad_requests_get_an_openai_error_naming_the_problem(client, kw, error, words):
    args = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, **kw}
    with pytest.raises(error) as e:
        client.completions.create(**args)
    assert words in str(e.value)


def test_weight_sync_loads_a_checkpoint_and_bumps_the_policy_version(client, server, checkpoint, checkpoint_b,
                                                                     tmp_path, tokenizer):
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=0, extra_body=IDS)
    before = client.completions.create(**kw).choices[0]
    r = httpx.post(server.url + "/update_weights_from_disk", json={"model_path": str(checkpoint_b)}, timeout=60)
    assert r.json() == {"success": True, "message": f"loaded {checkpoint_b}", "policy_version": 1}
    after = client.completions.create(**kw)
    assert after.policy_version == 1
    expected = recomputed(checkpoint_b, PROMPT, after.choices[0].token_ids, 1.0)
    assert after.choices[0].logprobs.token_logprobs == pytest.approx(expected, abs=1e-4)
    assert after.choices[0].logprobs.token_logprobs != before.logprobs.token_logprobs
    # an explicit version (the trainer's iteration); a missing directory is refused and changes nothing
    r = httpx.post(server.url + "/update_weights_from_disk", json={"model_path": str(checkpoint), "policy_version": 7})
    assert r.json()["policy_version"] == 7
    r = httpx.post(server.url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "nope")})
    assert r.status_code == 400 and "not a directory" in r.json()["message"]
    assert httpx.get(server.url + "/health").json()["policy_version"] == 7


def test_a_client_that_leaves_mid_stream_does_not_block_the_next_request(client, server):
    body = {"prompt": PROMPT, "max_tokens": 200, "stream": True, "stop_token_ids": [10_000_000]}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        first = next(r.iter_lines())
        assert first.startswith("data: ")
    # the stream was dropped after one chunk; the model lock must be free again
    # no end token (an unseeded sample of the tiny model may draw one first): the two tokens are owed
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, timeout=20,
                                  extra_body={"stop_token_ids": [10_000_000]})
    assert r.usage.completion_tokens == 2


def test_a_weight_load_mid_stream_leaves_that_stream_on_its_weights(client, server, checkpoint, checkpoint_b):
    body = {"prompt": PROMPT, "max_tokens": 40, "stream": True, "stop_token_ids": [10_000_000], "logprobs": 0,
            "seed": 1, "return_token_ids": True}
    chunks = []
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = (x for x in r.iter_lines() if x.startswith("data: {"))
        chunks.append(json.loads(next(lines)[6:]))
        sync = httpx.post(server.url + "/update_weights_from_disk", json={"model_path": str(checkpoint_b)}, timeout=60)
        assert sync.json()["policy_version"] == 1  # loaded while the stream is still generating
        chunks += [json.loads(x[6:]) for x in lines]
    assert {c["policy_version"] for c in chunks} == {0}
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    lps = [v for c in chunks if c["choices"][0]["logprobs"] for v in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert len(ids) == 40
    assert lps == pytest.approx(recomputed(checkpoint, PROMPT, ids, 1.0), abs=1e-4)  # all of it the old weights
    assert client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2).policy_version == 1


def test_a_lora_adapter_directory_is_served_on_its_base(tmp_path, checkpoint, tokenizer):
    from openai import OpenAI

    from arborl.policy import add_lora, save_adapter
    from arborl.serve import PolicyServer, ServedModel

    model, _ = load_policy(checkpoint)
    lora = add_lora(model, rank=2)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.fill_(0.3)
    adapter = save_adapter(lora, tokenizer, tmp_path / "adapter", base=checkpoint)
    with PolicyServer(ServedModel(adapter, device="cpu")) as s:
        c = OpenAI(base_url=s.base_url, api_key="unused", max_retries=0, timeout=60)
        r = c.completions.create(model="adapter", prompt=PROMPT, max_tokens=8, seed=4, logprobs=0, extra_body=IDS)
    ids = r.choices[0].token_ids
    with torch.no_grad():
        lp = token_logprobs(lora, torch.tensor([PROMPT + ids]))[0][len(PROMPT):].tolist()
    assert r.choices[0].logprobs.token_logprobs == pytest.approx(lp, abs=1e-4)
    assert r.choices[0].logprobs.token_logprobs != pytest.approx(recomputed(checkpoint, PROMPT, ids, 1.0), abs=1e-3)

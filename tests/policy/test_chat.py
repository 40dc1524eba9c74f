"""ChatRenderer: per-turn deltas concatenate to the full rendered conversation, for two templates."""

from __future__ import annotations

import pytest

from arborl.policy import ChatRenderer, TemplateError, observation_text

TURNS = [
    ("map : F F H G | P F F F . your move ?", "<answer>left</answer>"),
    ("map : F P H G . your move ?", "<answer>down</answer>"),
    ("your move ?", "<answer>up</answer>"),
]


def _pieces(renderer: ChatRenderer) -> tuple[list[int], list[dict]]:
    """Token ids fed turn by turn (prompts + responses) and the equivalent message list."""
    ids: list[int] = []
    messages: list[dict] = []
    for k, (obs, action) in enumerate(TURNS):
        ids += renderer.first_prompt(obs) if k == 0 else renderer.next_prompt(obs)
        ids += renderer.encode_response(action)
        messages += [{"role": "user", "content": obs}, {"role": "assistant", "content": action}]
    return ids, messages


@pytest.mark.parametrize("system_prompt", [None, "you are an agent on a frozen lake"])
@pytest.mark.parametrize("which", ["word_tokenizer", "chatml_tokenizer"])
def test_turn_deltas_equal_full_render(request, which, system_prompt):
    tok = request.getfixturevalue(which)
    renderer = ChatRenderer(tok, system_prompt)
    ids, messages = _pieces(renderer)
    full = list(tok.encode(tok.apply_chat_template(
        ([{"role": "system", "content": system_prompt}] if system_prompt else []) + messages,
        tokenize=False,
    ), add_special_tokens=False))
    # The full render ends with the template's tail after the last end-of-turn token.
    tail = renderer.next_prompt("x")[: len(full) - len(ids)] if len(full) > len(ids) else []
    assert full == ids + tail
    # With a generation prompt for a new observation, the deltas match exactly.
    nxt = renderer.next_prompt("your move ?")
    with_prompt = renderer.render_ids(messages + [{"role": "user", "content": "your move ?"}], generation_prompt=True)
    assert with_prompt == ids + nxt


def test_chatml_pieces_are_the_expected_tokens(chatml_tokenizer):
    r = ChatRenderer(chatml_tokenizer, None)
    dec = chatml_tokenizer.decode
    assert dec(r.first_prompt("hi")) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert dec(r.encode_response("<answer>up</answer>")) == "<answer>up</answer><|im_end|>"
    assert dec(r.next_prompt("yo")) == "\n<|im_start|>user\nyo<|im_end|>\n<|im_start|>assistant\n"
    assert r.end_token_ids == [chatml_tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_word_pieces_are_the_expected_tokens(word_tokenizer):
    r = ChatRenderer(word_tokenizer, "you are an agent")
    toks = word_tokenizer.convert_ids_to_tokens
    assert toks(r.first_prompt("your move ?")) == [
        "<|system|>", "you", "are", "an", "agent", "<|end|>", "<|user|>", "your", "move", "?", "<|end|>", "<|assistant|>"
    ]
    assert toks(r.encode_response("<answer>up</answer>")) == ["<answer>up</answer>", "<|end|>"]
    assert toks(r.next_prompt("map :")) == ["<|user|>", "map", ":", "<|end|>", "<|assistant|>"]
    assert r.end_token_ids == [5]
    assert r.decode(r.encode_response("<answer>up</answer>")) == "<answer>up</answer>"


def test_message_list_observations(chatml_tokenizer):
    r = ChatRenderer(chatml_tokenizer, "be brief")
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    ids = r.first_prompt("a") + r.encode_response("ok") + r.next_prompt(msgs)
    full = r.render_ids(
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "ok"}, *msgs], generation_prompt=True
    )
    assert ids == full
    assert observation_text(msgs) == "a\nb"
    with pytest.raises(TypeError, match="list of chat messages"):
        r.first_prompt([("user", "a")])


def test_template_that_rewrites_history_is_refused(word_tokenizer):
    tok = word_tokenizer.__class__(tokenizer_object=word_tokenizer.backend_tokenizer, eos_token="<|end|>")
    # Renders the number of messages up front: appending a message changes earlier tokens.
    tok.chat_template = (
        "{{ messages|length }} {% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    tok.add_tokens(["1", "2", "3", "4"])
    with pytest.raises(TemplateError, match="not prefix-stable"):
        ChatRenderer(tok, None)


def test_template_without_special_end_token_is_refused(word_tokenizer):
    tok = word_tokenizer.__class__(tokenizer_object=word_tokenizer.backend_tokenizer, eos_token="<|end|>")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} . {% endfor %}"
    with pytest.raises(TemplateError, match="not a special token"):
        ChatRenderer(tok, None)


def test_tokenizer_without_template_is_refused(word_tokenizer):
    tok = word_tokenizer.__class__(tokenizer_object=word_tokenizer.backend_tokenizer, eos_token="<|end|>")
    with pytest.raises(TemplateError, match="no chat_template"):
        ChatRenderer(tok, None)

"""The renderer remembers text observations: same ids as a fresh render, bounded, callers cannot corrupt it."""

from __future__ import annotations

import pytest

from arborl.policy import ChatRenderer
from arborl.policy import chat as chat_module

OBS = ["step 0 of board", "step 1 of board go", "step 0 of board", "the cell is now left"]


@pytest.mark.parametrize("which", ["word_tokenizer", "chatml_tokenizer"])
def test_remembered_pieces_equal_a_fresh_renderers(request, which):
    tok = request.getfixturevalue(which)
    kept = ChatRenderer(tok, "you are an agent")
    for obs in OBS * 2:
        fresh = ChatRenderer(tok, "you are an agent")  # an empty memo: renders through the template
        assert kept.first_prompt(obs) == fresh.first_prompt(obs)
        assert kept.next_prompt(obs) == fresh.next_prompt(obs)
        assert kept.encode_response(obs) == fresh.encode_response(obs)
    assert len(kept._memo) == 3 * len(set(OBS))


def test_a_caller_changing_the_returned_list_does_not_change_the_memo(word_tokenizer):
    r = ChatRenderer(word_tokenizer, None)
    first = r.next_prompt("step 0 of board")
    want = list(first)
    first.append(-1)
    assert r.next_prompt("step 0 of board") == want


def test_the_memo_is_bounded_and_messages_are_not_remembered(word_tokenizer, monkeypatch):
    monkeypatch.setattr(chat_module, "MEMO_SIZE", 2)
    r = ChatRenderer(word_tokenizer, None)
    for obs in OBS:
        r.next_prompt(obs)
        assert len(r._memo) <= 2
    assert r.next_prompt(OBS[0]) == ChatRenderer(word_tokenizer, None).next_prompt(OBS[0])
    before = len(r._memo)
    r.next_prompt([{"role": "user", "content": "step 0 of board"}])
    assert len(r._memo) == before

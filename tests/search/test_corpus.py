"""The generator: determinism, size, honest 2- and 3-hop questions, a subject-disjoint held-out split."""

from __future__ import annotations

import dataclasses
import re

import pytest

from arborl.config import ConfigError
from arborl.search.corpus import CorpusConfig, generate, held_out, write_dataset


def test_same_seed_same_bytes_other_seed_other_world(tmp_path):
    a = write_dataset(tmp_path / "a", CorpusConfig(seed=3, n_questions=500))
    b = write_dataset(tmp_path / "b", CorpusConfig(seed=3, n_questions=500))
    c = write_dataset(tmp_path / "c", CorpusConfig(seed=4, n_questions=500))
    for x, y, z in zip(a, b, c, strict=True):
        assert x.read_bytes() == y.read_bytes()
        assert x.read_bytes() != z.read_bytes()


def test_size_and_unique_ids_titles(world):
    passages, questions = world
    assert len(passages) == 60 + 1000 + 5400 + 3600 >= 10_000
    assert len({p.id for p in passages}) == len(passages)
    assert len({p.title for p in passages}) == len(passages)  # every entity name is unique
    assert len(questions) == 3000 and len({q.id for q in questions}) == 3000
    assert len({q.question for q in questions}) == 3000
    assert {q.hops for q in questions} == {1, 2}
    two = sum(q.hops == 2 for q in questions) / len(questions)
    assert 0.55 < two < 0.65  # two_hop_frac = 0.6


def test_every_hop_answer_is_in_its_supporting_passage(world, by_id):
    for q in world[1]:
        assert len(q.supporting_ids) == len(q.oracle_queries) == q.hops
        found = [*q.bridge_answers, q.golden_answers[0]]
        for pid, ans in zip(q.supporting_ids, found, strict=True):
            assert re.search(rf"\b{re.escape(ans)}\b", by_id[pid].text), (q, ans)


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


CROWDED = CorpusConfig(n_countries=3, n_cities=8, n_people=40, n_companies=60, n_questions=150)
"""Few cities for many people and companies: chance coincidences (HQ = a birth city) are common here."""


@pytest.mark.parametrize("crowded", [False, True], ids=["default", "crowded"])
@pytest.mark.parametrize("filler", [True, False], ids=["filler", "short"])
def test_two_hop_questions_need_the_first_answer(world, crowded, filler):
    if crowded:
        passages, questions = generate(dataclasses.replace(CROWDED, filler=filler))
    else:
        passages, questions = world if filler else generate(CorpusConfig(filler=False))
    by_id = {p.id: p for p in passages}
    two = [q for q in questions if q.hops == 2]
    for q in two:
        bridge, answer = q.bridge_answers[0], q.golden_answers[0]
        first, second = by_id[q.supporting_ids[0]], by_id[q.supporting_ids[1]]
        subject = by_id[q.extra["subject_id"]].title
        assert not _mentions(q.question, bridge)  # the question does not give the bridge away
        assert bridge in q.oracle_queries[1]  # the second query is built from the first result
        assert not _mentions(first.contents, answer)  # the first passage alone does not answer
        assert not _mentions(second.contents, subject)  # the second passage cannot be found from the question
    # no passage that names the subject holds the final answer (checked on a sample: 10k x 1.8k is slow)
    for q in two[::6 if not crowded else 1]:
        subject = by_id[q.extra["subject_id"]].title
        leaks = [p.id for p in passages if subject in p.contents and _mentions(p.contents, q.golden_answers[0])]
        assert not leaks, (q, leaks)


THREE = {"founder_birth_country", "ceo_birth_country", "founder_birth_city_founded", "ceo_birth_city_founded",
         "person_birth_capital"}


@pytest.mark.parametrize("crowded", [False, True], ids=["default", "crowded"])
def test_three_hop_questions_chain_two_bridges_and_need_each(crowded):
    base = dataclasses.replace(CROWDED, n_questions=120) if crowded else CorpusConfig(n_questions=1500)
    passages, questions = generate(dataclasses.replace(base, two_hop_frac=0.2, three_hop_frac=0.5))
    by_id = {p.id: p for p in passages}
    three = [q for q in questions if q.hops == 3]
    assert {q.extra["kind"] for q in three} == THREE
    assert {q.hops for q in questions} == {1, 2, 3}
    assert 0.4 < len(three) / len(questions) < 0.6 and 0.12 < sum(q.hops == 2 for q in questions) / len(questions) < 0.28
    for q in three:
        assert len(q.supporting_ids) == len(q.oracle_queries) == 3 and len(q.bridge_answers) == 2
        subject = by_id[q.extra["subject_id"]].title
        for i, bridge in enumerate(q.bridge_answers):
            assert not _mentions(q.question, bridge)  # no bridge is given away
            assert bridge in q.oracle_queries[i + 1]  # each later query is built from the result before it
            assert not _mentions(by_id[q.supporting_ids[i + 1]].contents, subject)  # not found from the question
        for pid, ans in zip(q.supporting_ids, [*q.bridge_answers, q.golden_answers[0]], strict=True):
            assert _mentions(by_id[pid].contents, ans), (q, ans)
        for pid in q.supporting_ids[:2]:  # neither earlier passage answers
            assert not _mentions(by_id[pid].contents, q.golden_answers[0]), q
    for q in three[::25 if not crowded else 1]:  # nor any passage that names the subject
        subject = by_id[q.extra["subject_id"]].title
        assert not [p.id for p in passages if subject in p.contents and _mentions(p.contents, q.golden_answers[0])]


def test_no_three_hop_share_draws_the_questions_of_before(world):
    assert generate(CorpusConfig(three_hop_frac=0.0))[1] == world[1]
    # the first question of the seed-0 draw, pinned: adding 3-hop kinds moved no 1- or 2-hop draw
    assert world[1][0].question == "What is the capital of the country where Baethkrus is located?"
    assert world[1][-1].question == "Who is the CEO of Graentaer Foundry?"


def test_split_is_by_subject_and_near_the_fraction(world):
    questions = world[1]
    subjects = {"train": set(), "test": set()}
    for q in questions:
        subjects[q.split].add(q.extra["subject_id"])
        assert q.split == ("test" if held_out(q.extra["subject_id"], 0.2) else "train")
    assert not subjects["train"] & subjects["test"]
    frac = sum(q.split == "test" for q in questions) / len(questions)
    assert 0.15 < frac < 0.25
    assert {q.hops for q in questions if q.split == "test"} == {1, 2}


@pytest.mark.parametrize("bad", [dict(n_countries=1), dict(n_cities=3, n_countries=5), dict(two_hop_frac=1.5),
                                 dict(test_frac=1.0), dict(n_questions=0), dict(three_hop_frac=0.5),
                                 dict(two_hop_frac=0.2, three_hop_frac=-0.1)])
def test_bad_config_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="corpus:"):
        CorpusConfig(**bad)


def test_too_many_questions_for_the_world():
    with pytest.raises(ConfigError, match="too many"):
        generate(CorpusConfig(n_countries=2, n_cities=4, n_people=4, n_companies=2, n_questions=100))


def test_a_world_where_every_city_is_a_capital_has_no_capital_questions():
    _, questions = generate(CorpusConfig(n_countries=5, n_cities=5, n_people=20, n_companies=10, n_questions=40))
    assert len(questions) == 40 and "city_capital" not in {q.extra["kind"] for q in questions}


def test_short_passages_keep_only_the_asked_facts_of_the_same_world(world):
    passages, questions = world
    short, short_questions = generate(CorpusConfig(filler=False))
    assert short_questions == questions  # the same world and questions; only the text differs
    assert [(p.id, p.title) for p in short] == [(p.id, p.title) for p in passages]
    by_id = {p.id: p.contents for p in short}
    # the seed-0 world's first country, its capital (the first city), a person and a company
    assert by_id["p00000"] == '"Palara"\nPalara is a country. Its capital is Kraemrard.'
    assert by_id["p00060"] == '"Kraemrard"\nKraemrard is a city located in Palara. Kraemrard was founded in 1581.'
    assert by_id["p01060"] == '"Talia Roumstan"\nTalia Roumstan was born in Naethje in 1944.'
    assert by_id["p06460"] == ('"Drumkeil Industries"\nDrumkeil Industries was founded in 2024 by Joren Heilvilzesk. '
                               "It is headquartered in Thethdraem. The CEO of Drumkeil Industries is Vesna Groudei.")
    full = {p.id: p.contents for p in passages}
    assert full["p01060"] == ('"Talia Roumstan"\nTalia Roumstan (born 1944) is an architect. He was born in Naethje. '
                              "Roumstan is known for careful, patient work.")
    for q in short_questions:  # every hop's answer is still in its supporting passage
        for pid, ans in zip(q.supporting_ids, [*q.bridge_answers, q.golden_answers[0]], strict=True):
            assert _mentions(by_id[pid], ans), (q, ans)
    words = sum(len(p.split()) for p in by_id.values()) / sum(len(p.split()) for p in full.values())
    assert words < 0.7

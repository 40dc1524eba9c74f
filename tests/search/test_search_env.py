"""The Search-R1 task env: tasks by seed, the search tool over real HTTP, reward, metrics, oracle, the server's lifecycle."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
import torch

from arborl.config import ConfigError
from arborl.env import check_env
from arborl.loss import ppo_clip_loss
from arborl.policy import ChatRenderer, ModelConfig, build_model, token_logprobs_and_entropy, train_tokenizer
from arborl.rollout import EpisodeSpec, RolloutConfig, SamplingConfig, ScriptedPolicy, run_episodes
from arborl.search.client import SearchClient
from arborl.search.env import load_dataset, search_r1_env
from arborl.search.retriever import BM25Retriever
from arborl.search.server import RetrieverServer
from arborl.search.tool import SearchTool, spaced
from arborl.tools import ErrorResult
from arborl.tools.metrics import episode_metrics, tool_metrics
from arborl.tools.services import running_services, shared_service, stop_services
from arborl.train.batch import collate

from .conftest import free_port

START = 1_000_000_000
ORACLE_DIAG = {"first_query_subject": 1.0, "gold_retrieved": 1.0, "answer_from_results": 1.0}
"""What the oracle gets on every diagnostic: it names the subject, finds the gold and copies it."""


@pytest.fixture(scope="module")
def data():
    return load_dataset()


@pytest.fixture(scope="module")
def env_kw(world, data):
    """Envs over one module-scoped server (the env's own in-process server is tested on its own)."""
    with RetrieverServer(BM25Retriever(world[0])) as server:
        yield {"url": server.url, "topk": 1}


def _play(env, seed: int) -> list:
    env.reset(seed=seed)
    out = []
    for _ in range(env.max_steps):
        action = env.expert_action()
        res = env.step(action)
        out.append((action, res))
        if res.terminated or res.truncated:
            break
    return out


def test_seeds_play_train_questions_below_the_start_and_held_out_ones_from_it(data, env_kw):
    _, train, test = data
    assert len(train) + len(test) == 3000 and 0.15 < len(test) / 3000 < 0.25
    assert not {q.extra["subject_id"] for q in train} & {q.extra["subject_id"] for q in test}
    env = search_r1_env(**env_kw)
    env.reset(seed=7)
    assert env.task.id == train[7].id
    env.reset(seed=START + 3)
    assert env.task.id == test[3].id
    env.reset(seed=START + len(test) + 3)  # wraps around
    assert env.task.id == test[3].id
    check_env(env)


def test_oracle_answers_every_question_and_metrics_are_hand_checkable(data, env_kw):
    _, train, test = data
    env = search_r1_env(**env_kw)
    one = next(i for i, q in enumerate(test) if q.hops == 1)
    two = next(i for i, q in enumerate(test) if q.hops == 2)
    q1, q2 = test[one], test[two]
    steps = _play(env, START + one)
    assert [a for a, _ in steps] == [f"<search>{q1.oracle_queries[0]}</search>", f"<answer>{q1.golden_answers[0]}</answer>"]
    assert steps[0][1].obs.startswith("<information>Doc 1(Title: ") and steps[-1][1].reward == 1.0
    # q1 (held-out 0, "Who founded Dredour Dynamics?", "Dario Brolkalbra") and q2 (held-out 1, "Where was
    # the CEO of Beirdmourd Group born?", "Stilas"): no training question has these answers
    assert (one, two) == (0, 1) and not {"dario brolkalbra", "stilas"} & {a.lower() for q in train for a in q.golden_answers}
    assert steps[-1][1].info["metrics"] == {"em": 1.0, "f1": 1.0, "searches": 1.0, **ORACLE_DIAG, "em_1hop": 1.0,
                                            "em_new_answer": 1.0}
    steps = _play(env, START + two)
    assert q2.bridge_answers[0] in steps[0][1].obs and q2.bridge_answers[0] in steps[1][0]
    assert steps[-1][1].info["metrics"] == {"em": 1.0, "f1": 1.0, "searches": 2.0, "two_hop_used_first": 1.0,
                                            **ORACLE_DIAG, "em_2hop": 1.0, "em_new_answer": 1.0}
    # every held-out question, by the oracle: exact match 1 (BM25 ranks the supporting passage first)
    assert all(_play(env, START + i)[-1][1].reward == 1.0 for i in range(0, len(test), 7))


def test_the_hermes_format_gets_the_same_oracle_calls_as_json_tool_calls(data, env_kw):
    _, _, test = data
    env = search_r1_env(**env_kw, tool_format="hermes")
    two = next(i for i, q in enumerate(test) if q.hops == 2)
    steps = _play(env, START + two)
    call = {"name": "search", "arguments": {"query": test[two].oracle_queries[0]}}
    assert steps[0][0] == f"<tool_call>{json.dumps(call)}</tool_call>"
    assert steps[0][1].obs.startswith("<tool_response>\nDoc 1(Title: ")
    assert steps[-1][1].reward == 1.0 and steps[-1][1].info["metrics"]["two_hop_used_first"] == 1.0
    check_env(env)


def test_wrong_answers_f1_format_reward_and_a_second_query_that_ignores_the_first_result(data, env_kw):
    _, _, test = data
    env = search_r1_env(**env_kw, format_reward=0.1)
    one = next(i for i, q in enumerate(test) if q.hops == 1 and len(q.golden_answers[0].split()) == 2)
    env.reset(seed=START + one)
    res = env.step(f"<answer>{test[one].golden_answers[0].split()[0]}</answer>")  # one of the two gold words
    assert res.reward == 0.1 and res.info["success"] is False
    # F1: precision 1, recall 1/2 -> 2/3
    # no search: the subject was not named in a first query and no result held the gold
    assert res.info["metrics"] == pytest.approx({"em": 0.0, "f1": 2 / 3, "searches": 0.0, "em_1hop": 0.0,
                                                 "first_query_subject": 0.0, "gold_retrieved": 0.0,
                                                 "answer_from_results": 0.0, "em_new_answer": 0.0})
    two = next(i for i, q in enumerate(test) if q.hops == 2)
    env.reset(seed=START + two)
    env.step(f"<search>{test[two].oracle_queries[0]}</search>")
    env.step("<search>something else entirely</search>")
    res = env.step("<answer>nothing</answer>")
    # the first query named the subject; its passage never holds a 2-hop answer, the second search matched nothing
    assert res.info["metrics"] == {"em": 0.0, "f1": 0.0, "searches": 2.0, "two_hop_used_first": 0.0, "em_2hop": 0.0,
                                   "first_query_subject": 1.0, "gold_retrieved": 0.0, "answer_from_results": 0.0,
                                   "em_new_answer": 0.0}  # held-out 0 and 1: no training question has their golds
    env.reset(seed=START + two)
    for _ in range(4):  # out of steps without answering: metrics with no answer
        res = env.step("no tags here")
    assert res.truncated and res.info["metrics"] == {  # no answer: no answer_from_results
        "em": 0.0, "f1": 0.0, "searches": 0.0, "two_hop_used_first": 0.0, "em_2hop": 0.0,
        "first_query_subject": 0.0, "gold_retrieved": 0.0, "em_new_answer": 0.0}


def test_the_diagnostics_tell_a_wrong_first_query_a_missing_gold_and_a_copied_wrong_answer(data, env_kw, by_id):
    _, _, test = data
    env = search_r1_env(**env_kw)
    i = next(i for i, q in enumerate(test) if q.extra["kind"] == "person_birthplace")
    q = test[i]
    subject = by_id[q.supporting_ids[0]].title  # "First Last"
    last = subject.split()[-1]
    env.reset(seed=START + i)
    env.step(f"<search>{last} born</search>")  # the last name only: BM25 still finds the passage
    res = env.step(f"<answer>{last}</answer>")  # a word of the result, not the birthplace
    assert res.info["metrics"] == {"em": 0.0, "f1": 0.0, "searches": 1.0, "em_1hop": 0.0,
                                   "first_query_subject": 0.0, "gold_retrieved": 1.0, "answer_from_results": 1.0,
                                   "em_new_answer": 0.0}  # no training question's answer is this birthplace
    env.reset(seed=START + i)
    env.step(f"<search>{subject} born</search>")
    env.step("<search>capital</search>")  # only the first query counts for first_query_subject
    res = env.step(f"<answer>{q.golden_answers[0][:-1]}</answer>")  # a cut-off word is not in the results
    assert res.info["metrics"] == {"em": 0.0, "f1": 0.0, "searches": 2.0, "em_1hop": 0.0,
                                   "first_query_subject": 1.0, "gold_retrieved": 1.0, "answer_from_results": 0.0,
                                   "em_new_answer": 0.0}


def test_spaced_text_puts_punctuation_and_tags_in_words_of_their_own_and_the_vocabulary_covers_held_out_names(
        data, env_kw):
    assert spaced('<search>Talia born</search> Doc 1(Title: "Talia V") V (born 1962).') == \
        '<search> Talia born </search> Doc 1 ( Title : " Talia V " ) V ( born 1962 ) .'
    _, _, test = data
    env = search_r1_env(**env_kw, spaced_text=True)
    vocab = set(env.vocabulary)
    assert all(set(spaced(q.question).split()) <= vocab and set(q.golden_answers[0].split()) <= vocab for q in test)
    obs, _ = env.reset(seed=START)
    assert obs[1]["content"] == spaced(test[0].question)
    action = env.expert_action()
    assert action.startswith("<search> ") and action.endswith(" </search>")
    res = env.step(action)
    assert set(res.obs.removeprefix("<information>").removesuffix("</information>").split()) <= vocab


def test_the_search_tool_turns_a_dead_service_into_an_error_result_after_its_retries():
    client = SearchClient(f"http://127.0.0.1:{free_port()}/retrieve", timeout=0.5, retries=2, backoff=0.01)
    out = SearchTool(client)({"query": "anything"})
    assert isinstance(out, ErrorResult) and out.startswith("SearchError: ") and "after 3 attempts" in out
    assert client.calls == 3
    assert SearchTool(client)({"query": "  "}).startswith("ArgumentError: ")


def test_the_env_starts_one_shared_server_and_stop_services_shuts_it_down(data):
    stop_services()
    envs: list = []
    threads = [threading.Thread(target=lambda: envs.append(search_r1_env(topk=1))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    urls = {e.table["search"].client.url for e in envs}
    assert len(urls) == 1 and running_services() == [("retriever", "generated:0", "bm25")]
    url = urls.pop()
    assert "Doc 1(Title:" in envs[0].table["search"]({"query": "capital"})
    stop_services()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url.replace("/retrieve", "/health"), timeout=2)
    assert running_services() == []
    started = []
    assert shared_service("k", start=lambda: started.append(1) or "svc", stop=lambda s: None) == "svc"
    assert shared_service("k", start=lambda: started.append(1) or "other", stop=lambda s: None) == "svc"
    assert started == [1]
    stop_services()


def test_every_retrieved_token_gets_exactly_zero_gradient(data, env_kw):
    """The foundation's masked-token invariant on the search task: <information> text is never trained on."""
    env_factory = lambda: search_r1_env(**env_kw, spaced_text=True)  # noqa: E731
    vocab = list(env_factory().vocabulary)
    tok = train_tokenizer(["Search with <search> query </search> answer <answer> </answer> <information>"],
                          extra_words=vocab)
    renderer = ChatRenderer(tok)
    specs = [EpisodeSpec(task_id=f"t{i}", task_type="search_r1", group_id="g", seed=START + i) for i in range(6)]
    eps = run_episodes(ScriptedPolicy(lambda env: env.unwrapped.expert_action(), renderer), env_factory, specs,
                       RolloutConfig(max_turns=4, max_context_tokens=1024, sampling=SamplingConfig(max_new_tokens=16)),
                       generator=torch.Generator().manual_seed(0))
    assert all(ep.success for ep in eps) and tool_metrics(eps)["tools/search/calls"] >= 6
    assert episode_metrics(eps)["em"] == 1.0
    model = build_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64,
                                    max_position_embeddings=1024), tok, seed=0)
    batch = collate(eps)
    retrieved: list[tuple[int, int]] = []
    for b, ep in enumerate(eps):
        k = 0
        for turn in ep.turns:
            if "Title :" in tok.decode(turn.prompt_ids):  # a search result
                retrieved += [(b, k + i) for i in range(len(turn.prompt_ids))]
            k += len(turn.prompt_ids) + len(turn.output_ids)
    assert len(retrieved) > 6 * 30
    captured = {}

    def keep(module, inputs, output):
        output.retain_grad()
        captured["logits"] = output

    handle = model.lm_head.register_forward_hook(keep)
    try:
        logp, ent = token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask)
    finally:
        handle.remove()
    adv = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(0)) * batch.loss_mask
    ppo_clip_loss(logp, batch.old_logp, adv, batch.loss_mask, entropy=ent, entropy_coef=0.01).loss.backward()
    g = captured["logits"].grad  # (B, T, V): the logits at t - 1 predict token t
    grad_of_token = torch.zeros(batch.loss_mask.shape)
    grad_of_token[:, 1:] = g[:, :-1].abs().sum(-1)
    assert all(batch.loss_mask[b, t] == 0 and grad_of_token[b, t] == 0.0 for b, t in retrieved)
    assert torch.count_nonzero(grad_of_token[batch.loss_mask == 1]) == int(batch.loss_mask.sum())


def test_more_questions_extend_the_default_set_and_keep_the_split():
    _, train, test = load_dataset()
    _, more_train, more_test = load_dataset(n_questions=4000)
    assert more_train[: len(train)] == train and more_test[: len(test)] == test  # the draw goes on
    assert len(more_train) + len(more_test) == 4000 and len(more_train) > len(train)
    train_subjects = {q.extra["subject_id"] for q in more_train}
    assert not train_subjects & {q.extra["subject_id"] for q in more_test}


def test_grounded_reward_pays_a_wrong_answer_copied_from_a_result_and_nothing_else(data, env_kw, by_id):
    _, _, test = data
    env = search_r1_env(**env_kw, format_reward=0.1, grounded_reward=0.3)
    i = next(i for i, q in enumerate(test) if q.extra["kind"] == "person_birthplace")
    q = test[i]
    last = by_id[q.supporting_ids[0]].title.split()[-1]
    answers = {f"<answer>{last}</answer>": (0.3, False),  # in the result, as a whole word: copied, wrong
               f"<answer>{q.golden_answers[0][:-1]}</answer>": (0.1, False),  # part of a word: not copied
               "<answer>nowhere</answer>": (0.1, False),
               f"<answer>{q.golden_answers[0]}</answer>": (1.0, True)}
    for answer, (reward, success) in answers.items():
        env.reset(seed=START + i)
        env.step(f"<search>{q.oracle_queries[0]}</search>")
        res = env.step(answer)
        assert (res.reward, res.info["success"]) == (reward, success), answer
    env.reset(seed=START + i)  # a new episode: the last one's results do not count
    assert env.step(f"<answer>{last}</answer>").reward == 0.1
    with pytest.raises(ConfigError, match="grounded_reward"):
        search_r1_env(**env_kw, grounded_reward=1.0)


def test_filler_false_serves_the_short_passages_from_a_server_of_its_own(data):
    stop_services()
    try:
        full, short = search_r1_env(topk=1), search_r1_env(topk=1, filler=False)
        assert running_services() == [("retriever", "generated:0", "bm25"), ("retriever", "generated:0:short", "bm25")]
        assert full.table["search"]({"query": "Talia Roumstan born"}) == (
            'Doc 1(Title: "Talia Roumstan") Talia Roumstan (born 1944) is an architect. He was born in Naethje. '
            "Roumstan is known for careful, patient work.\n")
        assert short.table["search"]({"query": "Talia Roumstan born"}) == (
            'Doc 1(Title: "Talia Roumstan") Talia Roumstan was born in Naethje in 1944.\n')
        assert short.tasks.train == data[1]  # the same questions
    finally:
        stop_services()


def test_em_new_answer_is_reported_only_where_no_training_question_has_the_gold(data, env_kw):
    _, train, test = data
    env = search_r1_env(**env_kw)
    assert test[0].golden_answers == ("Dario Brolkalbra",) and test[3].golden_answers == ("Veisia",)
    assert sum(q.golden_answers == ("Veisia",) for q in train) == 8  # a country: a frequent training answer
    env.reset(seed=START + 0)
    assert env.step("<answer>Anselm Zomneim</answer>").info["metrics"]["em_new_answer"] == 0.0  # a wrong name
    env.reset(seed=START + 3)
    assert "em_new_answer" not in env.step("<answer>Veisia</answer>").info["metrics"]  # right, but recallable
    env.reset(seed=0)  # a training question: its answer is a training answer by definition
    assert "em_new_answer" not in env.step(f"<answer>{train[0].golden_answers[0]}</answer>").info["metrics"]


def test_oracle_error_makes_the_teacher_answer_a_stable_share_of_2_hop_questions_with_the_bridge(data, env_kw):
    _, train, _ = data
    env = search_r1_env(**env_kw, oracle_error=0.5)
    two = [i for i, q in enumerate(train[:400]) if q.hops == 2]
    one = [i for i, q in enumerate(train[:400]) if q.hops == 1]
    slipped = []
    for i in two:
        steps = _play(env, i)
        q = train[i]
        if len(steps) == 2:  # searched once, answered the bridge: wrong, and a well-formed answer
            assert steps[0][0] == f"<search>{q.oracle_queries[0]}</search>"
            assert steps[1][0] == f"<answer>{q.bridge_answers[0]}</answer>" and steps[1][1].reward == 0.0
            slipped.append(i)
        else:
            assert len(steps) == 3 and steps[-1][1].reward == 1.0
    assert 0.4 < len(slipped) / len(two) < 0.6  # the share asked for, of the 2-hop questions
    assert all(_play(env, i)[-1][1].reward == 1.0 for i in one[:40])  # 1-hop questions: no slip
    again = search_r1_env(**env_kw, oracle_error=0.5)  # the same questions slip in a new env (a stable hash)
    assert [i for i in two if len(_play(again, i)) == 2] == slipped
    assert all(len(_play(search_r1_env(**env_kw, oracle_error=1.0), i)) == 2 for i in two[:20])
    with pytest.raises(ConfigError, match="oracle_error = 1.5"):
        search_r1_env(**env_kw, oracle_error=1.5)


def test_a_random_action_is_a_real_search_or_a_wrong_answer(data, env_kw, by_id):
    import random

    _, train, _ = data
    env = search_r1_env(**env_kw)
    titles = {p.title for p in by_id.values()}
    rng = random.Random(0)
    searches = answers = right = 0
    for seed in range(30):
        env.reset(seed=seed)
        question = train[seed].question.rstrip("?").split()
        for _ in range(env.max_steps):
            action = env.random_action(rng)
            res = env.step(action)
            assert res.info["action_valid"], action
            if action.startswith("<search>"):  # a run of the question's words or a title, retrieved for real
                query = action.removeprefix("<search>").removesuffix("</search>")
                words = query.split()
                runs = {" ".join(question[i:i + len(words)]) for i in range(len(question))}
                assert query in runs or query in titles
                assert res.obs.startswith("<information>Doc 1(Title: ") and not res.terminated
                searches += 1
            else:
                assert action.startswith("<answer>") and res.terminated
                answers += 1
                right += res.reward == 1.0
            if res.terminated or res.truncated:
                break
    assert searches > answers > 0 and right < answers / 2  # mostly searches, mostly wrong answers
    hermes = search_r1_env(**env_kw, tool_format="hermes")
    hermes.reset(seed=0)
    calls = [hermes.random_action(rng) for _ in range(20)]
    assert any(c.startswith('<tool_call>{"name": "search"') for c in calls)
    assert not any(c.startswith("<search>") for c in calls)


def test_three_hop_questions_the_oracle_its_slip_and_the_bridge_metric(env_kw):
    kw = {**env_kw, "n_questions": 600, "two_hop_frac": 0.2, "three_hop_frac": 0.5, "max_steps": 5}
    env = search_r1_env(**kw)
    _, train, _ = load_dataset("", "", 0, 0.2, 600, True, (0.2, 0.5))
    three = [i for i, q in enumerate(train) if q.hops == 3]
    q = train[three[0]]
    steps = _play(env, three[0])
    assert [a for a, _ in steps] == [*(f"<search>{x}</search>" for x in q.oracle_queries),
                                     f"<answer>{q.golden_answers[0]}</answer>"]
    assert q.bridge_answers[0] in steps[0][1].obs and q.bridge_answers[1] in steps[1][1].obs
    m = steps[-1][1].info["metrics"]
    assert steps[-1][1].reward == 1.0 and m["searches"] == 3.0 and m["em_3hop"] == 1.0 and m["bridges_used"] == 1.0
    assert "two_hop_used_first" not in m and "em_2hop" not in m
    # the first bridge used, the second not: the third query ignores what the second search showed
    env.reset(seed=three[0])
    env.step(f"<search>{q.oracle_queries[0]}</search>")
    env.step(f"<search>{q.oracle_queries[1]}</search>")
    env.step("<search>something else entirely</search>")
    m = env.step(f"<answer>{q.bridge_answers[1]}</answer>").info["metrics"]
    assert m["bridges_used"] == 0.5 and m["em_3hop"] == 0.0 and m["answer_from_results"] == 1.0
    # the oracle answers every 3-hop question it is given (BM25 ranks each supporting passage first)
    assert all(_play(env, i)[-1][1].reward == 1.0 for i in three[:60:3])
    # the imperfect teacher slips on 3-hop questions as on 2-hop ones: one search, the first bridge
    slip = search_r1_env(**kw, oracle_error=1.0)
    steps = _play(slip, three[0])
    assert [a for a, _ in steps] == [f"<search>{q.oracle_queries[0]}</search>", f"<answer>{q.bridge_answers[0]}</answer>"]
    assert steps[-1][1].reward == 0.0 and steps[-1][1].info["metrics"]["bridges_used"] == 0.0
    with pytest.raises(ConfigError, match="three_hop_frac = 0.6"):
        search_r1_env(**env_kw, three_hop_frac=0.6)
    with pytest.raises(ConfigError, match="your own"):
        search_r1_env(**env_kw, corpus="c.jsonl", qa="q.jsonl", three_hop_frac=0.2)


def test_envs_of_one_dataset_share_its_title_and_answer_lookups_computed_once(data, env_kw):
    """A run builds an env per engine slot and rollout call: the per-dataset lookups are built once."""
    from arborl.search import env as search_env
    from arborl.search.reward import normalize_answer

    passages, train, _ = data
    a, b = search_r1_env(**env_kw), search_r1_env(**env_kw)
    assert a.tasks is not b.tasks  # each env has its own task source (it points back at its env)
    assert a.tasks.titles is b.tasks.titles and a.tasks.train_answers is b.tasks.train_answers
    assert dict(a.tasks.titles) == {p.id: p.title for p in passages}
    assert a.tasks.train_answers == {normalize_answer(g) for q in train for g in q.golden_answers}
    with pytest.raises(TypeError):
        a.tasks.titles["x"] = "y"  # shared: read-only
    short = search_r1_env(**env_kw, n_questions=60)  # another dataset: its own lookups
    assert short.tasks.train_answers is not a.tasks.train_answers
    assert short.tasks.train_answers == {normalize_answer(g) for q in load_dataset(n_questions=60)[1]
                                         for g in q.golden_answers}
    assert search_env._lookups.cache_info().currsize >= 2
    # the questions differ, the passages do not: one retriever server serves both (retriever_url)
    assert load_dataset(n_questions=60)[0] == passages

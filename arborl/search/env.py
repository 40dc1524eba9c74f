"""The Search-R1 task: a :class:`~arborl.env.tool_env.ToolEnv` over a corpus, a QA set and a retriever.

``search_r1_env(**kwargs)`` is what a recipe names as ``env.cls`` (``arborl.search.env:search_r1_env``)::

    [env]
    cls = "arborl.search.env:search_r1_env"
    kwargs = { corpus = "", qa = "", url = "", topk = 3 }

It composes, as every tool task does, a task source, a tool table and a reward:

* **Tasks**: the QA set's questions; ``reset(seed=s)`` plays training question ``s % n_train``
  for ``s < test_seed_start`` and held-out question ``(s - test_seed_start) % n_test`` from there
  on (keep ``test_seed_start`` equal to the trainer's ``env.eval_seed_start``). With ``qa = ""``
  the seeded generator of :mod:`arborl.search.corpus` makes the corpus and questions (1-, 2- and,
  with ``three_hop_frac``, 3-hop; held-out split by subject); a user's QA file without a
  ``split`` field is split by a hash of each question id (``test_frac``).
* **Tool**: ``search`` (:class:`~arborl.search.tool.SearchTool`) over HTTP. With ``url = ""``
  the env starts an in-process retriever server (:class:`~arborl.search.server.RetrieverServer`)
  on a free loopback port the first time one is built, shares it with every env of the process,
  and stops it when the process ends (also on Ctrl-C; :mod:`arborl.tools.services`).
* **Reward**: exact match after Search-R1's normalisation; ``format_reward`` (default 0) is
  given instead for a well-formed but wrong answer, ``grounded_reward`` (default 0) for a wrong
  answer copied from a search result of the episode (a shaping term: the copy is the skill a
  small policy lacks; Search-R1 itself rewards exact match only). ``success`` is exact match.
* **Metrics** at the end of each episode (``info["metrics"]``): ``em``, ``f1``, ``searches`` (search
  calls), and for 2-hop questions ``two_hop_used_first`` (1 when a later query contains the
  bridge entity and the first search's results showed it: the second query used what the first
  search returned), for 3-hop ones ``bridges_used`` (the share of the two bridges that a search
  result showed and a later query contains). Where each step fails: ``em_1hop`` / ``em_2hop`` /
  ``em_3hop`` (exact match by the question's hops), ``first_query_subject`` (the first query
  names the subject, the title of the first supporting passage, as whole words), ``gold_retrieved`` (a gold answer was in some
  search result), ``answer_from_results`` (of the episodes that answered: the answer was copied
  from a search result), ``em_new_answer`` (exact match of the questions whose gold answer no
  training question has: a policy that recalls frequent answers instead of copying gets 0).
* **Expert** (for ``synth``): the generator's oracle queries (:func:`arborl.search.oracle.oracle_actions`).
  With ``oracle_error = p`` it is an imperfect teacher: on a share ``p`` of the multi-hop questions
  (a stable hash of the question id) it answers with the first bridge entity after the first
  search instead of searching again with it.

``spaced = true`` writes every punctuation mark as a word of its own in everything the model
reads (for arborl's word-level scratch tokenizer) and exposes ``vocabulary``, every word of the
corpus and questions, so a scratch tokenizer knows the names of held-out questions too. Leave it
off for a pretrained model and its own tokenizer.
"""

from __future__ import annotations

import functools
import json
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from arborl.config import ConfigError
from arborl.env import split
from arborl.env.tool_env import Task, ToolEnv
from arborl.search.client import SearchClient
from arborl.search.corpus import CorpusConfig, generate, held_out
from arborl.search.formats import Passage, Question, read_corpus, read_qa
from arborl.search.oracle import oracle_actions
from arborl.search.reward import exact_match, f1_score, normalize_answer, validate_gold
from arborl.search.tool import SearchTool, spaced
from arborl.tools.formats import FORMATS
from arborl.tools.services import shared_service

_HOPS = (CorpusConfig.two_hop_frac, CorpusConfig.three_hop_frac)
"""The generator's default shares of 2-hop and 3-hop questions."""


@functools.lru_cache(maxsize=4)
def load_dataset(corpus: str = "", qa: str = "", seed: int = 0, test_frac: float = 0.2, n_questions: int = 3000,
                 filler: bool = True, hop_fracs: tuple[float, float] = _HOPS
                 ) -> tuple[tuple[Passage, ...], tuple[Question, ...], tuple[Question, ...]]:
    """``(passages, train questions, test questions)``, read from files or generated (cached per process).

    ``hop_fracs``: the generated set's shares of 2-hop and 3-hop questions.

    Raises:
        ConfigError: One of ``corpus`` / ``qa`` is given without the other, or a split is empty.
        SchemaError: A bad line in a file, or a gold answer that cannot score 1.0.
    """
    if bool(corpus) != bool(qa):
        raise ConfigError("env.kwargs: give both `corpus` and `qa` (your own files), or neither (the generated set)")
    if corpus:
        passages, questions = read_corpus(corpus), read_qa(qa)
    else:
        passages, questions = generate(CorpusConfig(seed=seed, test_frac=test_frac, n_questions=n_questions,
                                                    filler=filler, two_hop_frac=hop_fracs[0],
                                                    three_hop_frac=hop_fracs[1]))
    validate_gold(questions)
    test = [q for q in questions if (q.split == "test" if q.split else held_out(q.id, test_frac))]
    test_ids = {q.id for q in test}
    train = [q for q in questions if q.id not in test_ids]
    if not train or not test:
        raise ConfigError(f"the QA set has {len(train)} training and {len(test)} held-out questions; both must be "
                          "non-empty (set each line's 'split' to train/test, or change test_frac)")
    return tuple(passages), tuple(train), tuple(test)


@functools.lru_cache(maxsize=4)
def _lookups(corpus: str, qa: str, seed: int, test_frac: float, n_questions: int, filler: bool,
             hop_fracs: tuple[float, float]) -> tuple[Mapping[str, str], frozenset[str]]:
    """Passage id -> title, and the normalised training answers: read-only, one copy per dataset.

    A run builds an env per engine slot and rollout call (thousands for ``synth``); computing these
    for each took ~60 ms of a ~64 ms build on the search recipe's 12,000 questions.
    """
    passages, train, _ = load_dataset(corpus, qa, seed, test_frac, n_questions, filler, hop_fracs)
    return (MappingProxyType({p.id: p.title for p in passages}),
            frozenset(normalize_answer(a) for q in train for a in q.golden_answers))


@functools.lru_cache(maxsize=4)
def _vocabulary(corpus: str, qa: str, seed: int, test_frac: float, n_questions: int, filler: bool = True,
                hop_fracs: tuple[float, float] = _HOPS) -> tuple[str, ...]:
    passages, train, test = load_dataset(corpus, qa, seed, test_frac, n_questions, filler, hop_fracs)
    words: dict[str, None] = {}
    framing = 'Doc 1(Title: "") 2 3 4 5 6 7 8 9 10 No passage matches the query. <answer> </answer> <search> </search>'
    for text in [framing] + [p.contents for p in passages] + [q.question for q in train + test] + [
            a for q in train + test for a in q.golden_answers]:
        words.update(dict.fromkeys(spaced(text).split()))
    return tuple(words)


def retriever_url(corpus: str, qa: str, seed: int, test_frac: float, method: str, filler: bool = True,
                  n_questions: int = 3000, hop_fracs: tuple[float, float] = _HOPS) -> str:
    """The URL of this process's retriever server for the dataset, started on first use.

    The passages do not depend on ``n_questions`` or ``hop_fracs`` (they shape the questions); given
    as the env's own, the server reads the passages of the env's cached dataset instead of drawing
    the world again.
    """
    from arborl.search.retriever import build_retriever
    from arborl.search.server import RetrieverServer

    def start() -> RetrieverServer:
        passages = load_dataset(corpus, qa, seed, test_frac, n_questions, filler, hop_fracs)[0]
        server = RetrieverServer(build_retriever(list(passages), method), method=method).start()
        print(f"arborl: retriever serving {len(passages)} passages ({method}) at {server.url}", file=sys.stderr)
        return server

    generated = f"generated:{seed}" + ("" if filler else ":short")
    return shared_service(("retriever", corpus or generated, method), start=start,
                          stop=RetrieverServer.stop).url


class _SearchTask:
    """Seed -> Task over the train and held-out questions; reward, metrics and oracle of the task."""

    def __init__(self, train: tuple[Question, ...], test: tuple[Question, ...], test_seed_start: int,
                 format_reward: float, text, titles: Mapping[str, str], train_answers: frozenset[str],
                 grounded_reward: float = 0.0, oracle_error: float = 0.0) -> None:
        self.train, self.test, self.test_seed_start = train, test, test_seed_start
        self.oracle_error = oracle_error
        self.format_reward, self.text, self.titles = format_reward, text, titles
        self.grounded_reward = grounded_reward
        self.train_answers = train_answers  # normalised; shared by the envs of a dataset (_lookups)
        self.env: ToolEnv | None = None  # the env this source serves (its calls are the episode's searches)
        self._title_list: list[str] | None = None  # random_action's titles, sorted once on first use

    def __call__(self, seed: int) -> Task:
        q = self.test[(seed - self.test_seed_start) % len(self.test)] if seed >= self.test_seed_start \
            else self.train[seed % len(self.train)]
        return Task(self.text(q.question), answer=q.golden_answers, id=q.id, metadata={"question": q})

    def reward(self, answer: str, task: Task) -> float:
        if exact_match(answer, task.answer):
            return 1.0
        copied = self.grounded_reward and self.env is not None and normalize_answer(answer) and any(
            _padded(answer) in _padded(r) for _, r in _searches(self.env))
        if copied:
            return max(self.grounded_reward, self.format_reward)
        return self.format_reward

    def metrics(self, env: ToolEnv, answer: str | None) -> dict[str, float]:
        assert env.task is not None
        q: Question = env.task.metadata["question"]
        searches = _searches(env)
        out = {"em": exact_match(answer, q.golden_answers), "f1": f1_score(answer, q.golden_answers),
               "searches": float(len(searches))}
        if q.hops == 2 and q.bridge_answers:
            out["two_hop_used_first"] = float(_used_after(normalize_answer(q.bridge_answers[0]), searches, 0))
        if q.hops >= 3 and len(q.bridge_answers) == q.hops - 1:
            out["bridges_used"] = sum(any(_used_after(normalize_answer(b), searches, j) for j in range(len(searches)))
                                      for b in q.bridge_answers) / len(q.bridge_answers)
        return out | self._diagnostics(q, searches, answer)

    def _diagnostics(self, q: Question, searches: list[tuple[str, str]], answer: str | None) -> dict[str, float]:
        """Which step of the search went wrong: the first query, the retrieval, or the copy of the answer."""
        results = [_padded(r) for _, r in searches]
        out = {f"em_{q.hops}hop": exact_match(answer, q.golden_answers)} if q.hops in (1, 2, 3) else {}
        if not any(normalize_answer(g) in self.train_answers for g in q.golden_answers):
            out["em_new_answer"] = exact_match(answer, q.golden_answers)  # only a copy can answer it
        subject = self.titles.get(q.supporting_ids[0]) if q.supporting_ids else None
        if subject:
            out["first_query_subject"] = float(bool(searches) and _padded(subject) in _padded(searches[0][0]))
        out["gold_retrieved"] = float(any(_padded(g) in r for g in q.golden_answers for r in results))
        if answer is not None and normalize_answer(answer):
            out["answer_from_results"] = float(any(_padded(answer) in r for r in results))
        return out

    def slips(self, q: Question) -> bool:
        """Whether the imperfect teacher answers ``q`` too early (a stable share ``oracle_error`` of multi-hop questions)."""
        return q.hops >= 2 and split.stable_unit(f"oracle-{q.id}") < self.oracle_error

    def expert(self, env: ToolEnv) -> str:
        assert env.task is not None
        q: Question = env.task.metadata["question"]
        actions = oracle_actions(q, think=False, stop_early=self.slips(q))
        return self._written(env, actions[min(env.steps, len(actions) - 1)])

    def random_action(self, rng: random.Random) -> str:
        """A well-formed search or answer with plausible, mostly wrong content (mid-training's noisy synthesis).

        A search for a few of the question's words in order, or for a random passage title; or an
        answer: a random title, or a run of words from the episode's last search result. The
        retriever answers every search for real.
        """
        env = self.env
        assert env is not None and env.task is not None, "random_action called before reset()"
        q: Question = env.task.metadata["question"]
        if self._title_list is None:
            self._title_list = sorted(set(self.titles.values()))
        results = [r.split() for _, r in _searches(env)]
        roll = rng.random()
        if roll < 0.6:
            run = _run_of(q.question.rstrip("?").split(), 4, rng)
            query = run if rng.random() < 0.6 or not self._title_list else rng.choice(self._title_list)
            return self._written(env, f"<search>{query}</search>")
        if results and results[-1] and rng.random() < 0.5:
            answer = _run_of(results[-1], 3, rng)
        else:
            answer = rng.choice(self._title_list) if self._title_list else q.question.split()[-1]
        return self._written(env, f"<answer>{answer}</answer>")

    def _written(self, env: ToolEnv, action: str) -> str:
        """``action`` (search-r1 tags) as the env's call format and text transform write it."""
        if env.call_format.name == "hermes" and action.startswith("<search>"):  # the same call as a JSON tool call
            query = action.removeprefix("<search>").removesuffix("</search>")
            action = f'<tool_call>{json.dumps({"name": "search", "arguments": {"query": query}})}</tool_call>'
        return self.text(action)


def search_r1_env(
    *,
    corpus: str = "",
    qa: str = "",
    corpus_seed: int = 0,
    test_frac: float = 0.2,
    n_questions: int = 3000,
    two_hop_frac: float = 0.6,
    three_hop_frac: float = 0.0,
    filler: bool = True,
    url: str = "",
    method: str = "bm25",
    topk: int = 3,
    timeout_s: float = 10.0,
    retries: int = 2,
    call_timeout_s: float = 30.0,
    max_steps: int = 4,
    format_reward: float = 0.0,
    grounded_reward: float = 0.0,
    oracle_error: float = 0.0,
    tool_format: str = "search_r1",
    spaced_text: bool = False,
    test_seed_start: int = 1_000_000_000,
    system_prompt: str | None = None,
    instructions: str = "",
) -> ToolEnv:
    """A Search-R1 :class:`~arborl.env.tool_env.ToolEnv` (see the module docstring).

    Args:
        corpus: Corpus JSONL (``{"id", "contents"}`` lines); ``""`` with ``qa = ""``: the generated set.
        qa: QA JSONL (``question``, ``golden_answers``; arborl's optional fields).
        corpus_seed: Seed of the generated set.
        test_frac: Held-out fraction (generated set; QA files without ``split``).
        n_questions: Questions of the generated set (the first 3,000 are the same for any larger
            number: the draw goes on). More questions = more distinct facts to learn from, so that
            a small policy cannot memorise the training answers instead of reading the passage.
        two_hop_frac: Generated set: the share of questions that need two searches.
        three_hop_frac: Generated set: the share that need three (company -> person -> city ->
            country or year; person -> city -> country -> capital); the rest need one. 0 (the
            default) draws the same questions as before it existed.
        filler: Generated set: ``False`` writes only the facts a question asks about in each passage
            (no city trait, occupation, language, industry): fewer words for a small reader to pass over.
        url: A running ``/retrieve`` endpoint; ``""`` starts one in-process (shared, stopped at exit).
        method: Retrieval of the in-process server: ``bm25`` or ``dense``.
        topk: Passages per search.
        timeout_s: HTTP timeout of one attempt; ``retries`` more attempts on transient failures.
        retries: Further attempts after a failed request.
        call_timeout_s: The env's deadline of one tool call (covers every attempt).
        max_steps: Turns per episode (searches + the answer).
        format_reward: Reward of a well-formed wrong answer (exact match scores 1).
        grounded_reward: Reward of a wrong answer that occurs, as whole words, in a search result
            of the episode (copied from a passage, the wrong one); the larger of the two applies.
        oracle_error: The expert (``synth``) as an imperfect teacher: on this share of the multi-hop
            questions (a stable hash of the question id) it answers with the bridge found by the
            first search instead of searching again, a wrong answer. The policy that imitates it
            stops early on multi-hop questions; RL has the later searches to discover.
        tool_format: ``search_r1`` (tags) or ``hermes`` (JSON tool calls).
        spaced_text: Punctuation as separate words in every text the model reads (scratch tokenizers).
        test_seed_start: Seeds from here on play held-out questions (= ``env.eval_seed_start``).
        system_prompt: Text put before the format's instructions.
        instructions: Replaces the format's instructions ("": keep them), e.g. one line for a small model.
    """
    if tool_format not in FORMATS:
        raise ConfigError(f"env.kwargs.tool_format = {tool_format!r}; choose one of {sorted(FORMATS)}")
    if not 0 <= format_reward < 1:
        raise ConfigError(f"env.kwargs.format_reward = {format_reward}; use a number in [0, 1) (exact match scores 1)")
    if not 0 <= oracle_error <= 1:
        raise ConfigError(f"env.kwargs.oracle_error = {oracle_error}; give a share in [0, 1] of the multi-hop questions")
    if not 0 <= grounded_reward < 1:
        raise ConfigError(f"env.kwargs.grounded_reward = {grounded_reward}; use a number in [0, 1) (exact match scores 1)")
    hops = (two_hop_frac, three_hop_frac)
    if corpus and hops != _HOPS:
        raise ConfigError("env.kwargs: two_hop_frac / three_hop_frac shape the generated set; with your own "
                          "`corpus` and `qa` files the questions are yours: remove them")
    # shares out of range are a ConfigError of CorpusConfig, which names them
    dataset = (corpus, qa, corpus_seed, test_frac, n_questions, filler, hops)
    _, train, test = load_dataset(*dataset)
    endpoint = url or retriever_url(corpus, qa, corpus_seed, test_frac, method, filler, n_questions, hops)
    text = spaced if spaced_text else _same
    titles, train_answers = _lookups(*dataset)
    source = _SearchTask(train, test, test_seed_start, format_reward, text, titles, train_answers, grounded_reward,
                         oracle_error)
    tool = SearchTool(SearchClient(endpoint, topk=topk, timeout=timeout_s, retries=retries), topk=topk,
                      transform=spaced if spaced_text else None)
    env = ToolEnv(source, [tool], source.reward, call_format=FORMATS[tool_format](), max_steps=max_steps,
                  call_timeout_s=call_timeout_s, system_prompt=system_prompt, task_type="search_r1",
                  expert=source.expert, metrics=source.metrics, format_instructions=instructions or None,
                  deterministic=oracle_error == 0)  # an imperfect expert is not checked for success
    source.env = env
    env.random_action = source.random_action  # type: ignore[attr-defined]
    if spaced_text:
        env.vocabulary = _vocabulary(corpus, qa, corpus_seed, test_frac, n_questions, filler, hops)  # type: ignore[attr-defined]
    return env


def _used_after(bridge: str, searches: list[tuple[str, str]], j: int) -> bool:
    """Whether search ``j``'s results showed ``bridge`` and a later query contains it."""
    return (j < len(searches) and bridge in normalize_answer(searches[j][1])
            and any(bridge in normalize_answer(query) for query, _ in searches[j + 1:]))


def _run_of(words: list[str], most: int, rng: random.Random) -> str:
    """1 to ``most`` consecutive words of ``words``, at a random place."""
    k = rng.randint(1, min(most, len(words)))
    start = rng.randrange(len(words) - k + 1)
    return " ".join(words[start:start + k])


def _same(text: str) -> str:
    return text


def _searches(env: ToolEnv) -> list[tuple[str, str]]:
    """``(query, result text)`` of each search call of the env's episode so far."""
    return [(args.get("query", ""), str(result)) for name, args, result in env.calls if name == "search"]


def _padded(text: str) -> str:
    """Normalised text between spaces: a padded a occurs in a padded b when a occurs in b as whole words."""
    return f" {normalize_answer(text)} "


def write_generated(out_dir: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """Write the generated corpus and QA set (what ``corpus = ""`` uses) as JSONL files."""
    from arborl.search.corpus import write_dataset

    return write_dataset(out_dir, CorpusConfig(seed=seed))

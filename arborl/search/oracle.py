"""Oracle trajectories for the cold start: the generator's ground-truth queries in Search-R1's tags.

For a question with ``oracle_queries`` ``[q1, q2]`` and bridge answer ``b``, the oracle acts::

    <think>I need to find ... I will search for it.</think>
    <search>q1</search>
                                   -> <information>Doc 1(Title: ...) ...</information>
    <think>The search shows b. Now I search with b.</think>
    <search>q2</search>
                                   -> <information>...</information>
    <think>The search shows the answer is A.</think>
    <answer>A</answer>

Each :class:`OracleTurn` is one model action and the observation the environment returns to it
(``None`` after the answer). The observations come from a real search function (e.g. a
:class:`~arborl.search.client.SearchClient`), so the synthesised text matches what the model
will see during RL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from arborl.search.formats import Question
from arborl.search.retriever import Hit
from arborl.trajectory.schema import SchemaError


@dataclass(frozen=True)
class OracleTurn:
    """One step: what the model writes and what the environment answers (``None`` when it ends)."""

    action: str
    observation: str | None


def information(passages_text: str) -> str:
    """Search results as Search-R1 returns them to the model."""
    return f"<information>{passages_text.strip()}</information>"


def oracle_actions(question: Question, *, think: bool = True, stop_early: bool = False) -> list[str]:
    """What the oracle writes for ``question``: one ``<search>`` per hop, then ``<answer>``.

    Args:
        question: A question with ``oracle_queries`` (and ``bridge_answers`` for 2-hop ones).
        think: Open each action with a short ``<think>`` that names what was found (the bridge).
        stop_early: The imperfect teacher's slip on a multi-hop question: it answers with the first
            bridge right after the first search (a wrong answer) instead of searching again.
            No effect on a 1-hop question.

    Raises:
        SchemaError: When the question has no oracle queries, or the bridges do not match them.
    """
    queries, bridges = question.oracle_queries, question.bridge_answers
    if not queries:
        raise SchemaError(f"question {question.id!r} has no 'oracle_queries'; oracle trajectories need them "
                          "(the generator writes them; for your own QA add one query per hop)")
    if len(bridges) != len(queries) - 1:
        raise SchemaError(f"question {question.id!r}: {len(queries)} oracle queries need {len(queries) - 1} "
                          f"'bridge_answers', got {len(bridges)}")
    answer = question.golden_answers[0]
    if stop_early and bridges:
        queries, answer = queries[:1], bridges[0]
    actions = []
    for hop, query in enumerate(queries):
        if hop == 0:
            thought = f"I need to find the answer to: {question.question} I will search for it."
        else:
            thought = f"The search shows {bridges[hop - 1]}. Now I need more about {bridges[hop - 1]}, so I search again."
        actions.append((f"<think>{thought}</think>\n" if think else "") + f"<search>{query}</search>")
    actions.append((f"<think>The search shows the answer is {answer}.</think>\n" if think else "")
                   + f"<answer>{answer}</answer>")
    return actions


def oracle_turns(question: Question, search: Callable[[str], str]) -> list[OracleTurn]:
    """The oracle's turns for ``question``: one search per hop, then the first gold answer.

    Args:
        question: A question with ``oracle_queries`` (and ``bridge_answers`` for 2-hop ones).
        search: Query -> formatted passages (``SearchClient.__call__`` or any such function).

    Raises:
        SchemaError: When the question has no oracle queries, or the bridges do not match them.
    """
    actions = oracle_actions(question)
    return [OracleTurn(action, information(search(query)))
            for action, query in zip(actions, question.oracle_queries, strict=False)] + [OracleTurn(actions[-1], None)]


def transcript(turns: list[OracleTurn]) -> str:
    """The turns as one Search-R1-style response text (actions and observations interleaved)."""
    parts = []
    for t in turns:
        parts.append(t.action)
        if t.observation is not None:
            parts.append(f"\n\n{t.observation}\n\n")
    return "".join(parts)


def oracle_recall(questions: Sequence[Question], search: Callable[[list[str], int], list[list[Hit]]], *,
                  topk: int = 3, batch_size: int = 64) -> tuple[float, int]:
    """Ranking sanity: the share of oracle queries whose supporting passage is in the top ``topk``.

    Args:
        questions: Questions with ``oracle_queries`` and ``supporting_ids`` (others are skipped).
        search: A batch search, ``BM25Retriever.search`` or ``SearchClient.search``.
        topk: Passages retrieved per query.
        batch_size: Queries per ``search`` call.

    Returns:
        ``(share, number of queries)``; ``(0.0, 0)`` when no question has oracle queries.
    """
    pairs = [(q.oracle_queries[h], q.supporting_ids[h]) for q in questions
             for h in range(min(len(q.oracle_queries), len(q.supporting_ids)))]
    found = 0
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i:i + batch_size]
        rows = search([query for query, _ in chunk], topk)
        found += sum(pid in {h.passage.id for h in row} for (_, pid), row in zip(chunk, rows, strict=True))
    return (found / len(pairs) if pairs else 0.0), len(pairs)

"""Retrievers: BM25 scores by hand, ranking sanity of the oracle queries on the generated corpus, dense."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from arborl.config import ConfigError
from arborl.search.formats import Passage, Question
from arborl.search.oracle import oracle_recall
from arborl.search.retriever import BM25Retriever, DenseRetriever, build_retriever
from tests.search.conftest import SMALL

FRUIT = [Passage("d0", "Kiwi", "kiwi apple"), Passage("d1", "Pear", "apple"), Passage("d2", "Plum", "plum plum plum")]
# indexed tokens (title + text): d0 [kiwi kiwi apple] dl 3, d1 [pear apple] dl 2, d2 [plum x4] dl 4; avgdl 3


def lucene(tf: int, df: int, dl: int, n: int = 3, avgdl: float = 3.0, k1: float = 1.5, b: float = 0.75) -> float:
    """Lucene's BM25 (no (k1 + 1) factor in the numerator, as bm25s's default method)."""
    return math.log(1 + (n - df + 0.5) / (df + 0.5)) * tf / (tf + k1 * (1 - b + b * dl / avgdl))


def test_bm25_scores_by_hand():
    r = BM25Retriever(FRUIT)
    ((kiwi,),) = r.search(["kiwi"], 1)
    # kiwi: df 1, idf ln(1 + 2.5/1.5) = 0.980829; d0 tf 2, dl = avgdl: 2 / (2 + 1.5) -> 0.560474
    assert kiwi.passage.id == "d0" and kiwi.score == pytest.approx(0.560474, rel=1e-5)
    assert kiwi.score == pytest.approx(lucene(2, 1, 3), rel=1e-5)
    # apple: df 2, idf ln(1.6) = 0.470004; the shorter d1 wins: 0.470004 / 2.125 = 0.221178 > 0.470004 / 2.5
    ((apple_1, apple_2),) = r.search(["the apple"], 2)
    assert [apple_1.passage.id, apple_2.passage.id] == ["d1", "d0"]
    assert apple_1.score == pytest.approx(0.221178, rel=1e-5) and apple_1.score == pytest.approx(lucene(1, 2, 2), rel=1e-5)
    assert apple_2.score == pytest.approx(0.188002, rel=1e-5)


def test_bm25_edge_queries():
    r = BM25Retriever(FRUIT)
    unknown, stopwords, empty = r.search(["zebra", "the of a", ""], 2)
    assert [h.score for h in unknown + stopwords + empty] == [0.0] * 6
    assert len(r.search(["plum"], 50)[0]) == 3  # topk above the corpus size returns the whole corpus
    assert r.search([], 3) == []


def test_unknown_method_and_empty_corpus():
    with pytest.raises(ConfigError, match="choose one of"):
        build_retriever(FRUIT, "tfidf")
    with pytest.raises(ConfigError, match="empty"):
        BM25Retriever([])


def test_oracle_queries_find_their_supporting_passage_top3(world, bm25):
    """Ranking sanity: measured 100.0% top-3 (and top-1) over all 4,800 oracle queries of seed 0."""
    questions = world[1]
    top3, n = oracle_recall(questions, bm25.search, topk=3)
    print(f"oracle queries: {n}, supporting passage in top-3: {top3:.1%}")
    assert n == sum(q.hops for q in questions) > 4000
    assert top3 >= 0.95


def test_oracle_recall_by_hand():
    r = BM25Retriever(FRUIT)
    qs = [Question("a", "?", ("x",), 1, ("d0",), ("kiwi",)), Question("b", "?", ("x",), 2, ("d1", "d2"), ("pear", "kiwi"))]
    # kiwi -> d0 (hit), pear -> d1 (hit), kiwi -> d0 but d2 wanted (miss): 2 of 3 at top-1
    assert oracle_recall(qs, r.search, topk=1, batch_size=2) == (pytest.approx(2 / 3), 3)
    assert oracle_recall(qs, r.search, topk=3) == (1.0, 3)
    assert oracle_recall([Question("c", "?", ("x",))], r.search) == (0.0, 0)


def test_questions_alone_do_not_find_the_second_hop(world, bm25):
    """Searching with the 2-hop question text rarely retrieves the bridge's passage: the first answer is needed."""
    two = [q for q in world[1] if q.hops == 2]
    hits = bm25.search([q.question for q in two], 3)
    found = sum(q.supporting_ids[1] in [h.passage.id for h in row] for q, row in zip(two, hits, strict=True)) / len(two)
    assert found < 0.05


@pytest.fixture(scope="module")
def small():
    from arborl.search.corpus import generate

    return generate(SMALL)


def test_dense_minilm_offline(small, tmp_path):
    passages, questions = small
    r = DenseRetriever(passages, cache_dir=tmp_path)
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert r.embeddings.shape == (len(passages), 384)
    for row in r.search([q.question for q in questions], 5):
        scores = [h.score for h in row]
        assert len(row) == 5 and scores == sorted(scores, reverse=True) and all(-1.0 <= s <= 1.0 + 1e-5 for s in scores)
    top3, n = oracle_recall(questions, r.search, topk=3)
    print(f"dense: {n} oracle queries, supporting passage in top-3: {top3:.1%}")
    assert top3 >= 0.9

    # a second start reads the cached vectors instead of embedding again; another corpus gets its own file
    (cached,) = tmp_path.glob("dense-*.npy")
    again = DenseRetriever(passages, cache_dir=tmp_path)
    assert again.cache_file == cached and (again.embeddings == r.embeddings).all()
    np.save(cached, np.zeros_like(r.embeddings))  # proof that the file, not the encoder, was read
    assert not DenseRetriever(passages, cache_dir=tmp_path).embeddings.any()
    other = DenseRetriever(passages[:10], cache_dir=tmp_path)
    assert other.cache_file != cached and other.embeddings.shape == (10, 384)
    assert other.embeddings == pytest.approx(r.embeddings[:10], abs=1e-5)

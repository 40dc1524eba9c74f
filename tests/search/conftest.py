"""Fixtures for the search tests: the default generated world (10,060 passages) and its BM25 index."""

from __future__ import annotations

import socket

import pytest

from arborl.search.corpus import CorpusConfig, generate
from arborl.search.retriever import BM25Retriever

SMALL = CorpusConfig(n_countries=6, n_cities=40, n_people=120, n_companies=80, n_questions=60)
"""A world small enough to embed with MiniLM in a few seconds."""


@pytest.fixture(scope="session")
def world():
    """(passages, questions) of the default config, seed 0."""
    return generate(CorpusConfig())


@pytest.fixture(scope="session")
def bm25(world):
    return BM25Retriever(world[0])


@pytest.fixture(scope="session")
def by_id(world):
    return {p.id: p for p in world[0]}


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

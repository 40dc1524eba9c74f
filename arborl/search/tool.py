"""The ``search`` tool: a :class:`~arborl.tools.base.Tool` over a Search-R1 retrieval endpoint.

Each call is one HTTP request through :class:`~arborl.search.client.SearchClient` (its timeout
per attempt, retries with backoff on connection errors, timeouts and 5xx answers). A failure
that survives the retries comes back as :class:`~arborl.tools.base.ErrorResult` text (the
model reads what went wrong; the tool env counts an error); it never raises.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from arborl.search.client import SearchClient, SearchError
from arborl.tools.base import ErrorResult

_PUNCT = re.compile(r'([.,;:!?()"]|</?[a-z_]+>)')


def spaced(text: str) -> str:
    """``text`` with every punctuation mark and tag a word of its own (``"(born 1962)."`` -> ``"( born 1962 ) ."``).

    For word-level tokenizers (arborl's scratch policies): a name followed by a full stop is then
    the same token as the name alone, so copying it from a passage into a query is one token, and
    ``<search> query </search>`` puts the tags in tokens of their own.
    """
    return " ".join(_PUNCT.sub(r" \1 ", text).split())


class SearchTool:
    """``search(query)``: the top passages for a query, as Search-R1 shows them.

    Args:
        client: The endpoint's client (timeouts and retries are set there).
        topk: Passages per call.
        transform: Applied to the result text (e.g. :func:`spaced`); ``None`` leaves it as served.

    Attributes:
        name: ``"search"`` (what :class:`~arborl.tools.formats.SearchR1Format` calls).
        description: Shown to the model in the Hermes format.
        parameters: ``{"query": string}``.
    """

    name = "search"
    description = "Search the document collection; returns the top passages for the query."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to search for, e.g. a name and a relation."}},
        "required": ["query"],
    }

    def __init__(self, client: SearchClient, *, topk: int = 3, transform: Callable[[str], str] | None = None) -> None:
        self.client, self.topk, self.transform = client, topk, transform

    def __call__(self, arguments: dict[str, Any]) -> str:
        """The passages for ``arguments["query"]``; an :class:`ErrorResult` when the service fails."""
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            return ErrorResult("ArgumentError: search needs a non-empty string 'query'")
        try:
            text = self.client(query, self.topk)
        except SearchError as exc:
            return ErrorResult(f"SearchError: {exc}")
        text = text if text.strip() else "No passage matches the query."
        return self.transform(text) if self.transform is not None else text

    def __repr__(self) -> str:
        return f"SearchTool({self.client.url!r}, topk={self.topk})"

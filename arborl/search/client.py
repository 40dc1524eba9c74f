"""A client of the Search-R1 retrieval protocol, with timeouts and retries.

``SearchClient(url)("query")`` returns the passages as the model sees them in Search-R1, one
line per passage::

    Doc 1(Title: "Talia Vossberg") Talia Vossberg (born 1962) is an engineer. ...
    Doc 2(Title: ...) ...

(the title keeps the quotes of the corpus's first line, as Search-R1's ``_passages2string``
leaves them). :meth:`SearchClient.search` returns the structured hits of a batch of queries.
Wrapping it as a tool is one call: the tool's ``__call__`` passes ``arguments["query"]``.

Connection errors, timeouts and 5xx answers are retried with exponential backoff; a 4xx
answer (a bad request) is not. When the retries are spent, :class:`SearchError` says what
failed and where.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from arborl.search.formats import Passage
from arborl.search.retriever import Hit


class SearchError(RuntimeError):
    """The retrieval service could not answer (down, too slow, or it rejected the request)."""


def format_passages(hits: Sequence[Hit]) -> str:
    """Search-R1's text for retrieved passages: ``Doc i(Title: <first line>) <rest>`` a line."""
    lines = []
    for i, hit in enumerate(hits, 1):
        title, _, text = hit.passage.contents.partition("\n")
        lines.append(f"Doc {i}(Title: {title}) {text}")
    return "\n".join(lines) + ("\n" if lines else "")


class SearchClient:
    """Talks to a ``/retrieve`` endpoint (arborl's server, Search-R1's, or any that speaks it).

    Args:
        url: The endpoint, e.g. ``http://127.0.0.1:8000/retrieve``.
        topk: Passages per query when a call does not say.
        timeout: Seconds for one HTTP request (connect and read).
        retries: Further attempts after a failed one (connection error, timeout, 5xx).
        backoff: Seconds before the first retry; doubles each time.
    """

    def __init__(self, url: str, *, topk: int = 3, timeout: float = 10.0, retries: int = 2,
                 backoff: float = 0.2) -> None:
        self.url, self.topk, self.timeout, self.retries, self.backoff = url, topk, timeout, retries, backoff
        self.calls = 0
        """Requests sent, retries included."""

    def request(self, body: dict) -> dict:
        """POST ``body`` as JSON and return the decoded answer, retrying transient failures."""
        data = json.dumps(body).encode()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            self.calls += 1
            req = urllib.request.Request(self.url, data=data, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                text = e.read().decode(errors="replace")[:300]
                if e.code < 500:
                    raise SearchError(f"{self.url} rejected the request (HTTP {e.code}): {text}") from None
                last = f"HTTP {e.code}: {text}"
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
        raise SearchError(f"{self.url} did not answer after {self.retries + 1} attempts "
                          f"(timeout {self.timeout} s each); last error: {last}")

    def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Hit]]:
        """The hits for each query, best first (one request for the whole batch)."""
        answer = self.request({"queries": list(queries), "topk": topk or self.topk, "return_scores": True})
        try:
            return [[Hit(Passage.from_contents(str(item["document"]["id"]), item["document"]["contents"]),
                         float(item["score"])) for item in row] for row in answer["result"]]
        except (KeyError, TypeError, ValueError) as e:
            raise SearchError(f"{self.url} answered in an unexpected shape ({type(e).__name__}: {e}); "
                              "expected {'result': [[{'document': {'id', 'contents'}, 'score'}, ...], ...]}") from None

    def __call__(self, query: str, topk: int | None = None) -> str:
        """The top passages for ``query`` as Search-R1 shows them to the model."""
        return format_passages(self.search([query], topk)[0])

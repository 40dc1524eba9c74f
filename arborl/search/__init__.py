"""Search-R1's data and retrieval side: a generated corpus and QA set, retrievers, an HTTP server, a client.

* :mod:`arborl.search.formats`: the corpus and QA JSONL formats, readers with ``file:line`` errors.
* :mod:`arborl.search.corpus`: the seeded generator of fictional entities and 1-/2-hop questions.
* :mod:`arborl.search.retriever`: BM25 (``bm25s``) and dense (MiniLM) retrievers.
* :mod:`arborl.search.server`: the ``POST /retrieve`` service (FastAPI + uvicorn), in-process or
  through ``arborl serve-retriever``.
* :mod:`arborl.search.client`: :class:`~arborl.search.client.SearchClient`, timeouts and retries.
* :mod:`arborl.search.reward`: exact match and F1 after the standard answer normalisation.
* :mod:`arborl.search.oracle`: oracle trajectories in Search-R1's tags for the cold start.

Nothing is imported here, so ``arborl --help`` stays fast; import the submodules.
"""

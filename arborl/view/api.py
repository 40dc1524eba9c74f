"""The viewer's read-only JSON API and its static page, as one FastAPI app.

Endpoints (all ``GET``; bad parameters get a 400 with ``{"error": "..."}`` naming the parameter and
the fix, an unknown episode or run a 404):

* ``/api/info``: the store URL (password masked), the runs, whether tokens can be decoded.
* ``/api/episodes``: a page of index rows; filters ``task_type``, ``source``, ``min_reward``,
  ``max_reward``, ``success`` (true/false), ``iteration``, ``min_iteration``, ``max_iteration``,
  ``policy_version``, ``tag`` (repeatable), ``stop_reason``, ``since``, ``until``; ``order``
  (newest/oldest), ``limit``, ``cursor`` (see :func:`arborl.view.data.list_page`).
* ``/api/count``: the number of episodes matching the same store filters.
* ``/api/episodes/{id}``: the episode as a tree of turns, with the continuations of its group.
* ``/api/episodes/{id}/group``: its group aligned by turn (:func:`arborl.view.data.group_json`).
* ``/api/episodes/{id}/media/{turn}/{k}``: the ``k``-th media item of a turn, from the blob store.
* ``/api/profile``: the capability profile (``group_by``, store filters).
* ``/api/runs/{k}``: run ``k``'s metrics.jsonl rows and summary.json.

The store is opened with ``read_only=True``: a write would raise, and nothing is created.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from arborl.store.base import EpisodeNotFound, StoreError, check_group_by
from arborl.store.url import open_store, redact
from arborl.train.advantages import AdvantageIndex
from arborl.trajectory.schema import SchemaError
from arborl.view import data

STATIC = Path(__file__).parent / "static"


class _Filters:
    """The store filters as query parameters (a FastAPI dependency)."""

    def __init__(self, task_type: str | None = None, source: str | None = None, min_reward: float | None = None,
                 max_reward: float | None = None, success: bool | None = None, iteration: int | None = None,
                 min_iteration: int | None = None, max_iteration: int | None = None,
                 policy_version: int | None = None, tag: Annotated[list[str] | None, Query()] = None, since: float | None = None,
                 until: float | None = None) -> None:
        given = {"task_type": task_type, "source": source, "min_reward": min_reward, "max_reward": max_reward,
                 "success": success, "iteration": iteration, "min_iteration": min_iteration,
                 "max_iteration": max_iteration, "policy_version": policy_version, "tags": tag or None,
                 "since": since, "until": until}
        self.value = {k: v for k, v in given.items() if v is not None and v != ""}


FilterParams = Annotated[_Filters, Depends()]


def _bad_params(_: Request, exc: RequestValidationError) -> JSONResponse:
    problems = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e.get("loc", ()) if p not in ("query", "path"))
        problems.append(f"parameter {where!r}: {e.get('msg', 'invalid')} (got {e.get('input')!r})")
    return JSONResponse({"error": "; ".join(problems) + "; fix the parameter and retry"}, status_code=400)


def create_app(store_url: str, run_dirs: Sequence[str | Path] = ()) -> FastAPI:
    """The viewer app over the store at ``store_url`` (opened read-only) and ``run_dirs``.

    Raises:
        StoreError: the URL names no arborl store (nothing is created), or a bad URL.
        FileNotFoundError: a run directory does not exist.
    """
    runs = [Path(r) for r in run_dirs]
    for r in runs:
        if not r.is_dir():
            raise FileNotFoundError(f"run directory {r} does not exist; pass --run RUN_DIR of a finished or running run")
    store = open_store(store_url, read_only=True)
    decode = data.token_decoder(runs)
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    app = FastAPI(title="arborl view", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, _bad_params)

    @app.exception_handler(EpisodeNotFound)
    def _not_found(_: Request, e: EpisodeNotFound) -> JSONResponse:
        return JSONResponse({"error": f"no episode {e.args[0]!r} in this store; pick one from /api/episodes"}, 404)

    @app.exception_handler(ValueError)
    def _bad_value(_: Request, e: ValueError) -> JSONResponse:
        return JSONResponse({"error": redact(str(e))}, 400)

    @app.exception_handler(StoreError)
    def _store_error(_: Request, e: StoreError) -> JSONResponse:
        return JSONResponse({"error": redact(str(e))}, 500)

    @app.exception_handler(SchemaError)
    def _schema_error(_: Request, e: SchemaError) -> JSONResponse:
        return JSONResponse({"error": redact(str(e))}, 500)

    _routes(app, store, store_url, runs, decode)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _routes(app: FastAPI, store: Any, store_url: str, runs: list[Path], decode: Any) -> None:
    recorded = AdvantageIndex(runs)

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/api/info")
    def info() -> dict[str, Any]:
        return {"store": redact(store_url), "runs": [{"k": k, "name": r.name, "path": str(r)} for k, r in enumerate(runs)],
                "decoded_tokens": decode is not None, "max_page": data.MAX_PAGE}

    @app.get("/api/episodes")
    def episodes(f: FilterParams, stop_reason: str | None = None, order: str = "newest",
                 limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
        return data.list_page(store, f.value, stop_reason=stop_reason or None, order=order, limit=limit,
                              cursor=cursor or None)

    @app.get("/api/count")
    def count(f: FilterParams) -> dict[str, Any]:
        return {"count": store.count(**f.value)}

    @app.get("/api/episodes/{episode_id}")
    def episode(episode_id: str) -> dict[str, Any]:
        row = store.index_row(episode_id)
        ep = store.get(episode_id)
        members = [r.episode_id for r in data.group_rows(store, row) if r.episode_id != episode_id]
        others = store.get_many(members) if members else []
        out = data.episode_json(ep, others, decode)
        for t in out["turns"]:  # what the runs' credit gave each turn (run_dir/advantages.jsonl)
            t["advantages"].update(recorded.get(t["turn_id"]))
        return out

    @app.get("/api/episodes/{episode_id}/group")
    def group(episode_id: str) -> dict[str, Any]:
        rows = data.group_rows(store, store.index_row(episode_id))
        return {"group_id": rows[0].group_id if rows else None,
                **data.group_json(store.get_many([r.episode_id for r in rows]))}

    @app.get("/api/episodes/{episode_id}/media/{turn_index}/{k}")
    def media(episode_id: str, turn_index: int, k: int) -> Response:
        ep = store.get(episode_id)
        if not 0 <= turn_index < len(ep.turns) or not 0 <= k < len(ep.turns[turn_index].media):
            raise ValueError(f"episode {episode_id} has no media {k} on turn {turn_index}; "
                             "use the media listed by /api/episodes/{id}")
        ref = ep.turns[turn_index].media[k]
        return Response(store.get_media(ref), media_type=ref.mime)

    @app.get("/api/profile")
    def profile(f: FilterParams, group_by: str = "task_type,iteration") -> dict[str, Any]:
        cols = check_group_by([c for c in group_by.split(",") if c])
        return {"group_by": list(cols), "rows": [p.to_dict() for p in store.profile(group_by=cols, **f.value)]}

    @app.get("/api/runs/{k}")
    def run(k: int) -> JSONResponse:
        if not 0 <= k < len(runs):
            return JSONResponse({"error": f"no run {k}; this viewer has runs 0..{len(runs) - 1} (--run RUN_DIR)"}, 404)
        try:
            rows = data.read_metrics(runs[k])
        except FileNotFoundError:
            return JSONResponse({"error": f"{runs[k]} has no metrics.jsonl yet; is it an arborl run directory?"}, 404)
        return JSONResponse({"name": runs[k].name, "metrics": rows, "summary": data.read_summary(runs[k])})

"""Batched multi-turn rollout: many environments, one model forward per decoding step.

``run_episodes`` keeps up to ``batch_size`` episodes live, each in a *slot*. Turns advance in
lockstep: every live episode generates its turn together, then every environment steps. A slot
freed by a finished episode takes the next pending spec at the following turn, so the batch stays
full until the specs run out.

Cache layout. A :class:`~arborl.rollout.generate.LMSession` holds one
:class:`~arborl.rollout.kvcache.BatchKVCache`: per decoder layer, keys and values in a
``(B, H_kv, capacity, D)`` buffer written in place (no per-step copy of the whole cache), row
``b`` = one live slot, plus a ``(B, L)`` 0/1 mask of which of the ``L`` used columns hold real
tokens. Each episode's cache is kept across turns: a turn prefills only the tokens that are new
since the last one (the previous turn's last sampled token and ``ChatRenderer.next_prompt``),
never the whole history. Finished slots are removed by re-indexing the buffers; new episodes
join as new rows whose earlier columns are masked.

Padding and positions. New chunks of different lengths are *left*-padded into one prefill
forward, so each row's last real token is in the last column and its logits start decoding.
Rows that finish a turn early keep feeding a masked pad until the whole batch is done. Position
ids are explicit and count real tokens only (``n_real + cumsum(chunk_mask) - 1``), so a row's
rotary positions are exactly those of its unpadded conversation; pad columns carry a dummy
position and are masked out of every attention. When more than a quarter of the cache columns
are padding, the cache is compacted (real columns gathered to the right, in order); since keys
carry their positions already and attention over cached keys is order-free, this changes
nothing numerically beyond float rounding.

Log-prob convention. The recorded behaviour log-prob of a sampled token is
``log_softmax(logits / T)[token]`` under the full distribution, where ``T`` is the sampling
temperature (1 for greedy); top-p truncation is ignored. The trainer recomputes exactly this with
:func:`arborl.policy.logprobs.token_logprobs` at ``cfg.sampling.logprob_temperature``.

Turn budget. A turn samples at most ``max_new_tokens`` tokens; a turn cut at the budget gets a
forced end-of-turn token (mask 0, log-prob 0) so the conversation stays well formed.

Threads. The engine leaves ``torch.set_num_threads`` to the caller. For tiny policies on a shared
CPU, one thread per process is fastest: intra-op threads add a barrier to every small op
(see ``bench/rollout.py``).

Continuations. An :class:`~arborl.rollout.config.EpisodeSpec` may carry ``prefix`` (a trunk's
first turns) and ``origin``: the episode then starts with those very turns (shared, not
generated again; ``Episode.origin`` records where they come from), the env re-plays their actions
from the seed to reach the state they lead to, and the policy continues from there.
``branch_action`` forces the first own turn (an action text, trained on); its tokens still get
the policy's log-probs, so the log-prob invariant holds for them too. This is how
:mod:`arborl.rollout.branch` tries every action at a visited state and :mod:`arborl.rollout.tree`
re-samples from a turn. With a ``prefix_cache`` (:class:`~arborl.rollout.kvcache.PrefixCache`),
every finished policy sample's cache row is kept under its episode id, and a continuation of it starts
from that row: only the tokens the row does not hold are prefilled (the trunk's last turn's
unfed tail and the continuation's prompt). Without one (or with a scripted policy, which has no
cache) the prefix is prefilled in one forward pass with the first prompt.

Errors. An exception in ``reset``, ``step``, ``format_observation`` or ``state_key`` (or in a
scripted policy) is recorded (``Turn.error``, or ``Episode.metadata["error"]`` when no turn
exists) and stops that episode with stop_reason "env_error"; the rest of the batch goes on.

Env concurrency. The resets of the episodes that join a turn, and the steps of every live
episode after it, run on ``cfg.env_workers`` threads (:mod:`arborl.rollout.workers`), so the
env phase of a turn lasts as long as its slowest step: a slow tool call of one episode runs
while the others' steps finish. Turns still advance in lockstep (the decoder needs every live
slot), so the next turn starts when the slowest step is back. Each call has the deadline
``cfg.env_timeout_s``; an overdue one stops its episode ("env_error", the error names the
deadline) and its env is never used again. Results are collected in slot order and envs share
no state through the engine, so the episodes are the same whatever the thread timing.

Images. An observation's image parts are stored through ``media`` and referenced on the turn that
shows them; their placeholders stay in the cache, so later turns attend over every earlier image
(:mod:`arborl.rollout.media`, ``docs/multimodal.md``).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from arborl.env.base import Env
from arborl.env.wrappers import guard
from arborl.policy.chat import ChatRenderer, observation_text
from arborl.rollout.config import EpisodeSpec, RolloutConfig
from arborl.rollout.generate import TurnOutput, TurnRequest
from arborl.rollout.kvcache import PrefixCache
from arborl.rollout.media import Eyes, MediaSink, split_images
from arborl.rollout.policy import Policy, PolicySession
from arborl.rollout.workers import Overdue, WorkerPool
from arborl.trajectory.schema import Episode, MediaRef, StopReason, ToolCall, Turn, new_id
from arborl.trajectory.values import is_storable, storable_text


@dataclass
class _Live:
    """A running episode: its record, its environment and what to feed next."""

    episode: Episode
    env: Any
    slot: int
    obs_text: str
    prompt: list[int]
    state_key: str | None
    spec: EpisodeSpec | None = None
    prefix_ids: list[int] | None = None
    """The shared prefix's tokens, until the first turn feeds them."""
    n_tokens: int = 0
    returns: float = 0.0
    success: float | None = None
    hung: bool = False
    """The last env call passed its deadline: the env may still be running it."""
    eyes: Eyes = field(default_factory=Eyes)
    """How images in observations are handled (:mod:`arborl.rollout.media`)."""
    images: list[Any] = field(default_factory=list)
    """Images of ``prompt`` (then of the prefix too, until the first turn feeds them), in order."""
    media: list[MediaRef] = field(default_factory=list)
    """Their references in the media store, for the turn that shows them."""


def run_episodes(
    policy: Policy,
    env_factory: Callable[[], Env] | list[Env],
    specs: list[EpisodeSpec],
    cfg: RolloutConfig,
    *,
    generator: torch.Generator,
    policy_version: int = 0,
    iteration: int = -1,
    source: str = "rl",
    prefix_cache: PrefixCache | None = None,
    media: MediaSink | None = None,
) -> list[Episode]:
    """Run one episode per spec, batched, and return them in spec order.

    Args:
        policy: :class:`~arborl.rollout.policy.ModelPolicy` or
            :class:`~arborl.rollout.policy.ScriptedPolicy`.
        env_factory: A zero-argument env constructor (one env is built per slot and reused via
            ``reset``; an env that raised is replaced), or a list of envs used as the slots (at
            most ``len(list)`` episodes run at once).
        specs: Episodes to run.
        cfg: Budgets, penalty, sampling and batch size.
        generator: Random source of sampling (same seed and inputs, same episodes).
        policy_version: Recorded on every turn and episode.
        iteration: Training iteration recorded on episodes (-1: not training).
        source: Stage recorded on episodes ("rl", "synth", "eval", ...).
        prefix_cache: Keep every finished policy sample's cache row here (by episode id), and start
            continuations (specs with a ``prefix``) from their trunk's kept row.
        media: Where images of observations go (a store: ``put_media``); the turns reference them
            (:mod:`arborl.rollout.media`). Needed only by envs whose observations carry images.

    Returns:
        One :class:`~arborl.trajectory.schema.Episode` per spec, each a linear chain of turns (a
        continuation's first turns are its trunk's).
    """
    if not specs:
        return []
    pool = _EnvPool(env_factory)
    n_slots = min(cfg.batch_size, len(specs), pool.capacity)
    limit = cfg.max_context_tokens
    if policy.max_context_tokens is not None:
        limit = min(limit, int(policy.max_context_tokens))
    session = policy.open_session(cfg.sampling, generator, prefix_cache)
    results: list[Episode | None] = [None] * len(specs)
    queue = deque(enumerate(specs))
    free = list(range(n_slots - 1, -1, -1))
    live: dict[int, tuple[int, _Live]] = {}
    meta = (policy_version, iteration, source)
    eyes = Eyes(getattr(policy, "images", None), media)

    def finish(slot: int, stop_reason: StopReason) -> None:
        index, lv = live.pop(slot)
        lv.episode.stop_reason = stop_reason
        lv.episode.rewards = {"success": lv.success, "return": lv.returns}
        results[index] = lv.episode
        if prefix_cache is not None and stop_reason != "env_error":
            _keep_row(session, lv)
        session.release(slot)
        if pool.recycle(slot, failed=stop_reason == "env_error", hung=lv.hung):
            free.append(slot)

    workers = WorkerPool(cfg.env_workers)
    try:
        while queue or live:
            starting = [(free.pop(), *queue.popleft()) for _ in range(min(len(queue), len(free)))]
            for slot, index, lv in _start_all(starting, pool, workers, policy.renderer, meta, cfg.env_timeout_s, eyes):
                if isinstance(lv, Episode):  # reset failed
                    results[index] = lv
                    if pool.recycle(slot, failed=True):
                        free.append(slot)
                else:
                    live[slot] = (index, lv)
            _fail_if_stuck(queue, bool(live or free), results, meta, cfg.env_timeout_s)
            for slot in _overlong(live, cfg, limit):
                finish(slot, "max_context")
            if live:
                for slot, stop in _play_turn(session, live, cfg, limit, policy.renderer, policy_version, workers):
                    finish(slot, stop)
    finally:
        workers.close()
        pool.close()
    if any(ep is None for ep in results):
        raise RuntimeError("run_episodes lost an episode; this is a bug in the rollout engine")
    return [ep for ep in results if ep is not None]


def _overlong(live: dict[int, tuple[int, _Live]], cfg: RolloutConfig, limit: int) -> list[int]:
    """The live slots whose next turn would not fit in ``limit`` tokens (their last turn marked truncated)."""
    out = []
    for slot, (_, lv) in live.items():
        if lv.n_tokens + len(lv.prompt) + cfg.sampling.max_new_tokens + 1 > limit:
            if lv.episode.turns:
                lv.episode.turns[-1].truncated = True
            out.append(slot)
    return out


def _play_turn(
    session: PolicySession,
    live: dict[int, tuple[int, _Live]],
    cfg: RolloutConfig,
    limit: int,
    renderer: ChatRenderer,
    policy_version: int,
    workers: WorkerPool,
) -> list[tuple[int, StopReason]]:
    """Generate one turn for every live episode, step the envs; returns (slot, stop) of those ending."""
    slots = sorted(live)
    requests = []
    for slot in slots:
        lv = live[slot][1]
        budget = min(cfg.sampling.max_new_tokens, limit - lv.n_tokens - len(lv.prompt) - 1)
        prefix, lv.prefix_ids = lv.prefix_ids or [], None
        requests.append(TurnRequest(slot=slot, prompt_ids=lv.prompt, max_new_tokens=budget, env=lv.env,
                                    forced_ids=_forced_ids(lv, renderer), prefix_ids=prefix, images=lv.images,
                                    prefix_key=lv.spec.origin.of if prefix and lv.spec and lv.spec.origin else None))
    t0 = time.perf_counter()
    outs = session.generate(requests)
    gen_s = time.perf_counter() - t0
    ended: dict[int, StopReason] = {}
    stepping = []
    for slot, out in zip(slots, outs, strict=True):
        lv = live[slot][1]
        turn = _record(lv, out, gen_s, renderer, policy_version)
        if turn is None:
            ended[slot] = "env_error"
        else:
            stepping.append((slot, lv, turn, copy.copy(turn)))
    # the env steps of the turn, concurrently; results in slot order whatever the thread timing
    stops = workers.run_calls([lambda a=lv, t=turn: _timed_step(a, t, cfg, renderer) for _, lv, turn, _ in stepping],
                              cfg.env_timeout_s)
    for (slot, lv, _, before), stop in zip(stepping, stops, strict=True):
        if isinstance(stop, Overdue):  # the step may still be writing into `turn`: keep the copy made before it
            lv.hung = True
            before.error = f"env step did not return within {stop.timeout_s:g} s (rollout.env_timeout_s)"
            before.timings = {**before.timings, "env": stop.timeout_s}
            lv.episode.turns[-1] = before
            stop = "env_error"
        if stop is not None:
            ended[slot] = stop
    return sorted(ended.items())


def _forced_ids(lv: _Live, renderer: ChatRenderer) -> list[int] | None:
    """The tokens this turn must feed instead of sampling: a branch's forced action."""
    spec = lv.spec
    if spec is not None and spec.branch_action is not None and len(lv.episode.turns) == len(spec.prefix):
        return renderer.encode_response(spec.branch_action)
    return None


def _start_all(
    starting: list[tuple[int, int, EpisodeSpec]], pool: _EnvPool, workers: WorkerPool, renderer: ChatRenderer,
    meta: tuple[int, int, str], timeout_s: float, eyes: Eyes,
) -> list[tuple[int, int, _Live | Episode]]:
    """Start the ``(slot, index, spec)`` episodes concurrently: ``(slot, index, live or failed episode)``."""
    started = workers.run_calls([lambda s=slot, sp=spec: _start(sp, pool, s, renderer, meta, eyes)
                                 for slot, _, spec in starting], timeout_s)
    out: list[tuple[int, int, _Live | Episode]] = []
    for (slot, index, spec), lv in zip(starting, started, strict=True):
        if isinstance(lv, Overdue):  # the env may still be resetting: it is never used again
            pool.abandon(slot)
            lv = _overdue_reset(spec, meta, lv)
        out.append((slot, index, lv))
    return out


def _keep_row(session: PolicySession, lv: _Live) -> None:
    """Keep a trunk's cache row for its continuations (an episode that generated a turn and continues none).

    A continuation's own row is not kept: branch and tree rollouts continue policy samples only,
    and a kept row costs ``2 * layers * kv_heads * head_dim`` floats per token.
    """
    keep = getattr(session, "keep", None)  # a scripted policy has no cache to keep
    if keep is not None and lv.episode.origin is None and lv.episode.turns:
        keep(lv.slot, lv.episode.episode_id, _path_tokens(lv.episode.turns))


def _path_tokens(turns: list[Turn]) -> list[int]:
    """Every token of a chain of turns in order: each turn's prompt ids, then its output ids."""
    ids: list[int] = []
    for t in turns:
        ids += t.prompt_ids
        ids += t.output_ids
    return ids


def _start(
    spec: EpisodeSpec, pool: _EnvPool, slot: int, renderer: ChatRenderer, meta: tuple[int, int, str], eyes: Eyes,
) -> _Live | Episode:
    """Reset the slot's env and render the first prompt; an Episode (stop "env_error") if that fails."""
    try:
        env = pool.get(slot)
    except Exception as exc:  # a failing factory fails this episode only
        env, factory_error = None, f"env factory failed: {type(exc).__name__}: {exc}"
    else:
        factory_error = None
    ep = _episode(spec, _env_name(env) if env is not None else None, meta)
    lv = _Live(episode=ep, env=env, slot=slot, obs_text="", prompt=[], state_key=None, spec=spec, eyes=eyes)
    try:
        if factory_error is not None:
            raise RuntimeError(factory_error)
        obs, _ = env.reset(seed=spec.seed, options=spec.options)
        shown = _see(lv, _shown(env, obs))
        lv.state_key = _key_text(env.state_key())
        lv.prompt = lv.eyes.prompt(renderer.first_prompt(shown), lv.images)
        lv.obs_text = observation_text(shown)
        if spec.prefix and _replay_prefix(lv, renderer) is not None:
            return ep  # the env ended inside the prefix: nothing to continue (a diverged continuation)
    except Exception as exc:  # recorded on the episode; the batch goes on
        ep.stop_reason = "env_error"
        ep.metadata["error"] = storable_text(factory_error or f"reset or prefix re-play failed: {type(exc).__name__}: {exc}")
        ep.rewards = {"success": None, "return": 0.0}
        return ep
    return lv


def _replay_prefix(lv: _Live, renderer: ChatRenderer) -> StopReason | None:
    """Re-play a continuation's shared prefix in its env; the turns are the trunk's, not recorded again.

    Returns the stop reason if the env ended before the prefix did (the episode is then finished).
    """
    ep, prefix = lv.episode, lv.spec.prefix  # type: ignore[union-attr]
    for turn in prefix:
        ep.turns.append(turn)
        res = lv.env.step(turn.action_text)
        lv.returns += float(res.reward)
        info = res.info or {}
        if info.get("success") is not None:
            lv.success = 1.0 if info["success"] else 0.0
        if res.terminated or res.truncated:
            ep.stop_reason = "terminated" if res.terminated else "truncated"
            ep.rewards = {"success": lv.success, "return": lv.returns}
            return ep.stop_reason
        shown = _see(lv, _shown(lv.env, res.obs))
        lv.state_key = _key_text(lv.env.state_key())
        lv.prompt = lv.eyes.prompt(renderer.next_prompt(shown), lv.images)
        lv.obs_text = observation_text(shown)
    lv.prefix_ids = _path_tokens(list(prefix))
    lv.images = lv.eyes.reload(prefix) + lv.images  # the prefix's images, then the prompt's
    lv.n_tokens = len(lv.prefix_ids)
    return None


def _episode(spec: EpisodeSpec, env_name: str | None, meta: tuple[int, int, str]) -> Episode:
    """The empty record of the episode ``spec`` describes."""
    policy_version, iteration, source = meta
    ep = Episode(task_id=spec.task_id, task_type=spec.task_type, group_id=spec.group_id, seed=spec.seed,
                 policy_version=policy_version, iteration=iteration, source=source, metadata={"env": env_name})
    if spec.options is not None and _is_jsonable(spec.options):
        ep.metadata["options"] = spec.options
    if spec.metadata:
        ep.metadata.update(spec.metadata)
    ep.origin = spec.origin
    return ep


def _fail_if_stuck(queue: deque, can_run: bool, results: list[Episode | None], meta: tuple[int, int, str],
                   timeout_s: float) -> None:
    """When no slot can run (every env hung), record each queued spec as an episode whose env passed the deadline."""
    while queue and not can_run:
        index, spec = queue.popleft()
        results[index] = _overdue_reset(spec, meta, Overdue(timeout_s))


def _overdue_reset(spec: EpisodeSpec, meta: tuple[int, int, str], overdue: Overdue) -> Episode:
    """The record of an episode whose reset passed the deadline (stop "env_error")."""
    ep = _episode(spec, None, meta)
    ep.stop_reason = "env_error"
    ep.metadata["error"] = f"reset did not return within {overdue.timeout_s:g} s (rollout.env_timeout_s)"
    ep.rewards = {"success": None, "return": 0.0}
    return ep


def _record(lv: _Live, out: TurnOutput, gen_s: float, renderer: ChatRenderer, policy_version: int) -> Turn | None:
    """Add the generated turn to the episode; ``None`` when generation failed (the episode ends)."""
    ep = lv.episode
    turn = Turn(
        turn_id=new_id(),
        parent_id=ep.turns[-1].turn_id if ep.turns else None,
        index=len(ep.turns),
        observation=lv.obs_text,
        prompt_ids=list(lv.prompt),
        output_ids=out.ids,
        output_logprobs=out.logprobs,
        output_mask=out.mask,
        state_key=lv.state_key,
        policy_version=policy_version if out.policy_version is None else out.policy_version,
        timings={"generate": gen_s},
        media=list(lv.media),
    )
    ep.add_turn(turn)
    lv.n_tokens += len(lv.prompt) + len(out.ids)
    if out.error is not None:
        turn.error, turn.valid = out.error, False
        return None
    turn.action_text = storable_text(out.text if out.text is not None else renderer.decode(out.ids))
    return turn


def _timed_step(lv: _Live, turn: Turn, cfg: RolloutConfig, renderer: ChatRenderer) -> StopReason | None:
    """Step the env with the turn's action (on a worker thread); an exception ends the episode."""
    t0 = time.perf_counter()
    try:
        stop = _step(lv, turn, cfg, renderer)
    except Exception as exc:  # recorded on the turn; the batch goes on
        turn.error = storable_text(f"{type(exc).__name__}: {exc}")
        stop = "env_error"
    turn.timings["env"] = time.perf_counter() - t0
    return stop


def _step(lv: _Live, turn: Turn, cfg: RolloutConfig, renderer: ChatRenderer) -> StopReason | None:
    res = lv.env.step(turn.action_text)
    info = dict(res.info or {})
    reward = float(res.reward)
    if not math.isfinite(reward):
        raise ValueError(f"env returned a non-finite reward {res.reward!r}")
    turn.valid = info.get("action_valid", True) is not False
    turn.reward = reward + (0.0 if turn.valid else float(cfg.invalid_action_penalty))
    action = info.get("action")
    turn.action = None if action is None else str(action)
    turn.terminated, turn.truncated = bool(res.terminated), bool(res.truncated)
    # after the prompt's images; a new list: the copy kept in case the step hangs shares the old one
    turn.media = [*turn.media, *(m for m in info.get("media", []) or [] if isinstance(m, MediaRef))]
    turn.info = {k: v for k, v in info.items() if k != "media" and _is_jsonable(v)}
    turn.tool_call = _tool_call(info.get("tool_call"))
    if isinstance(info.get("tool_latency_s"), int | float):
        turn.timings["tool"] = float(info["tool_latency_s"])
    if info.get("error") is not None:
        turn.error = storable_text(str(info["error"]))
    lv.returns += reward
    if "success" in info and info["success"] is not None:
        lv.success = 1.0 if info["success"] else 0.0
    shown, images = split_images(_shown(lv.env, res.obs), lv.eyes.marker)
    turn.result = observation_text(shown)
    if turn.terminated:
        return "terminated"
    if turn.truncated:
        return "truncated"
    if len(lv.episode.turns) >= cfg.max_turns:
        turn.truncated = True
        return "max_turns"
    lv.state_key = _key_text(lv.env.state_key())
    lv.images, lv.media = images, lv.eyes.store(images)  # stored only when a next turn shows them
    lv.prompt = lv.eyes.prompt(renderer.next_prompt(shown), lv.images)
    lv.obs_text = turn.result
    return None


def _tool_call(record: Any) -> ToolCall | None:
    """``Turn.tool_call`` from an env's ``info["tool_call"]`` (``{"name", "arguments", "call_id"}``)."""
    if not isinstance(record, dict) or not isinstance(record.get("name"), str):
        return None
    args = dict(record["arguments"]) if isinstance(record.get("arguments"), dict) else {}
    if not is_storable(args):  # e.g. a NUL the model wrote into a JSON string: kept readable, not dropped
        args = {"unstorable_arguments": storable_text(repr(args)[:4096])}
    call_id = record.get("call_id")
    return ToolCall(name=storable_text(record["name"]), arguments=args,
                    call_id=storable_text(call_id) if isinstance(call_id, str) else None)


class _EnvPool:
    """Envs by slot: from a list (borrowed, never closed) or built by a factory (closed at the end).

    Every env is handed out inside an :class:`~arborl.env.wrappers.EpisodeGuard`, so the
    episode-boundary rules hold whatever the env does after its end.
    """

    def __init__(self, source: Callable[[], Env] | list[Env]) -> None:
        if isinstance(source, list | tuple):
            if not source:
                raise ValueError("the env list is empty; pass at least one env or an env factory")
            self._fixed: list[Any] | None = [guard(env) for env in source]
            self._factory: Callable[[], Env] | None = None
        elif callable(source):
            self._fixed, self._factory = None, source
        else:
            raise TypeError(f"env_factory must be a callable or a list of envs, got {type(source).__name__}")
        self._built: dict[int, Any] = {}
        self._dead: set[int] = set()

    @property
    def capacity(self) -> int:
        return len(self._fixed) if self._fixed is not None else 1 << 30

    def get(self, slot: int) -> Any:
        if self._fixed is not None:
            return self._fixed[slot]
        if slot not in self._built:
            self._built[slot] = guard(self._factory())  # type: ignore[misc]
        return self._built[slot]

    def discard(self, slot: int) -> None:
        """Replace a factory-built env that raised (it may be in a broken state)."""
        env = self._built.pop(slot, None)
        if env is not None:
            _close_quietly(env)

    def abandon(self, slot: int) -> None:
        """Forget the env of a slot whose call passed its deadline, without touching it (it may still run).

        A factory-built env is replaced at the slot's next use; a borrowed one cannot be, so the
        slot is retired.
        """
        if self._fixed is not None:
            self._dead.add(slot)
        self._built.pop(slot, None)

    def recycle(self, slot: int, *, failed: bool, hung: bool = False) -> bool:
        """Prepare a finished slot for its next episode; False when it cannot run one (its env hung).

        An env that raised may be broken and is replaced; one that hung may still be running and
        is abandoned (see :meth:`abandon`).
        """
        if failed:
            if hung:
                self.abandon(slot)
            else:
                self.discard(slot)
        return slot not in self._dead

    def close(self) -> None:
        for env in self._built.values():
            _close_quietly(env)
        self._built.clear()


def _close_quietly(env: Any) -> None:
    # Closing is best effort: the episode records are already complete.
    with contextlib.suppress(Exception):
        env.close()


def _env_name(env: Any) -> str:
    """The env's class name (an env in a Ray worker, arborl.cluster.RemoteEnv, names the class it runs)."""
    return getattr(env.unwrapped, "remote_class_name", None) or type(env.unwrapped).__name__


def _key_text(key: Hashable) -> str | None:
    if key is None:
        return None
    return key if isinstance(key, str) else repr(key)


def _shown(env: Env, obs: Any) -> Any:
    """``env.format_observation(obs)`` with NUL characters and lone surrogates replaced (U+FFFD).

    Env text may carry what model-written code printed; the tokenizer cannot encode a lone
    surrogate and the store refuses both, so the model sees and the turn records the cleaned text.
    """
    shown = env.format_observation(obs)
    if isinstance(shown, str):
        return storable_text(shown)
    return [{**m, "content": storable_text(m["content"])} if isinstance(m.get("content"), str) else m for m in shown]


def _see(lv: _Live, shown: Any) -> Any:
    """The observation with its images taken out (markers in their place); they are stored and kept on ``lv``."""
    shown, images = split_images(shown, lv.eyes.marker)
    lv.images, lv.media = images, lv.eyes.store(images)
    return shown


def _is_jsonable(value: Any) -> bool:
    return is_storable(value)  # the store's rule: what it would refuse is dropped here, not in put_many

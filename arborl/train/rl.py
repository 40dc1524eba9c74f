"""Online RL for multi-turn agents: group rollouts -> store -> credit -> PPO-clip update, top to bottom.

Each iteration samples ``tasks_per_iter`` training tasks and rolls each out ``group_size`` times
from the same seed (the GRPO group), stores the episodes and reads them back, turns rewards into
one advantage per turn with the configured credit estimator (a pure function handed in by the
config layer), broadcasts it to the model-generated tokens of that turn, and takes
``ppo_epochs`` passes of PPO-clip minibatch updates with an optional KL term to the frozen
start-of-RL policy.

With ``rl.branch``, each iteration also rolls out branches (:mod:`arborl.rollout.branch`): every
state the group visited is re-played and every action no member took there is forced, so the
credit estimator (``best_step`` in the demo) compares all actions of every visited state.

With ``rl.filter = "starpo_s"``, only the groups whose scores vary most are credited and trained
on (:mod:`arborl.credit.filters`); the filter runs before the estimator, whichever it is.

Implementation details (where this departs from the papers):

* Trajectory-level group statistics (not per step row; docs/credit.md §2).
* The invalid-action penalty is part of the episode score as well as the step reward, so a
  malformed answer lowers every token of that trajectory, not only its own turn.
* ``length_neutral`` (default on) gives each episode the same total weight whatever its length;
  without it, tokens that appear in every turn (the end-of-turn token) drift with
  ``sum_i A_i T_i`` and the format erodes (observed: collapse to 0 success at lr 2e-3).
* Checkpoints hold weights, optimizer state, every RNG stream and the counters, so
  ``--resume`` continues exactly where the run stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from arborl.config import ConfigError
from arborl.credit import StepBatch, credit_on_groups, starpo_s_groups
from arborl.env import Env
from arborl.loss import ppo_clip_loss
from arborl.policy import load_policy, packed, save_policy, token_logprobs, token_logprobs_and_entropy
from arborl.policy.model import (
    add_lora,
    is_lora,
    load_weights,
    resolve_device,
    save_adapter,
    set_training_options,
    to_device,
)
from arborl.policy.packed import packed_token_logprobs_and_entropy
from arborl.policy.vision import image_spec
from arborl.rollout import RolloutConfig, run_episodes
from arborl.rollout.branch import branch_specs, own_turns
from arborl.rollout.http_policy import rollout_policy
from arborl.rollout.kvcache import PrefixCache
from arborl.rollout.media import image_inputs, media_of
from arborl.rollout.tree import tree_specs
from arborl.rollout.vllm_policy import vllm_rollout_policy
from arborl.tools.metrics import episode_metrics, tool_metrics
from arborl.train.advantages import record_advantages
from arborl.train.async_rollout import Rollout, RolloutProcess, RolloutWorker
from arborl.train.batch import (
    TokenBatch,
    broadcast,
    collate,
    failed,
    length_chunks,
    micro_chunks,
    prefix_chunks,
    step_batch,
)
from arborl.train.common import (
    load_trainer_state,
    rng_state,
    save_trainer_state,
    set_rng_state,
    task_type_of,
)
from arborl.train.config import RLConfig, TrainConfig
from arborl.train.credit_models import CreditContext, CreditModel
from arborl.train.embeddings import freeze_embeddings
from arborl.train.interrupt import Interrupted, StopRequest
from arborl.train.loggers import Metrics
from arborl.train.profile import PhaseTimer, torch_threads
from arborl.train.progress import progress
from arborl.train.rundir import checkpoint_iteration, latest_checkpoint, prune_checkpoints
from arborl.train.stages import evaluate, policy_dir, specs_for
from arborl.train.writer import BackgroundWriter, flush, readable, store_episodes

CreditFn = Callable[[StepBatch], Tensor]


def _update(model, opt, cfg: TrainConfig, batch: TokenBatch, adv: Tensor, ref_logp: Tensor | None,
            gen: torch.Generator, prox_logp: Tensor | None = None) -> dict[str, float]:
    """``ppo_epochs`` passes of minibatch PPO-clip steps over one iteration's batch (decoupled with ``prox_logp``)."""
    rc, temp = cfg.rl, cfg.rollout.sampling.logprob_temperature
    sums: dict[str, float] = {}
    n = 0
    chunks = length_chunks(batch, rc.minibatch_size)
    tokens_per_chunk = max(float(batch.loss_mask.sum()) / len(chunks), 1.0)
    # rl.micro_batch_tokens: pieces with accumulated gradients (token-mean only: the step stays the same);
    # planned once, for every epoch
    cap = rc.micro_batch_tokens if rc.loss_agg == "token-mean" else 0
    planned = [_pieces(model, batch, rows, cap, rc.prefix_share) for rows in chunks]
    for _ in range(rc.ppo_epochs):
        for c in torch.randperm(len(chunks), generator=gen).tolist():
            opt.zero_grad(set_to_none=True)
            pieces = planned[c]
            mb_tokens = max(float(batch.loss_mask[chunks[c]].sum()), 1.0)
            terms: dict[str, float] = {}
            for mb, pack in pieces:
                sub = batch.select(mb)
                w = sub.input_ids.shape[1]
                if pack:
                    logp, ent = packed_token_logprobs_and_entropy(
                        model, sub.input_ids, sub.attention_mask, temperature=temp, positions=sub.loss_mask,
                        entropy_grad=rc.entropy_coef != 0, pack_tokens=pack)
                else:
                    logp, ent = token_logprobs_and_entropy(model, sub.input_ids, sub.attention_mask, temperature=temp,
                                                           positions=sub.loss_mask, entropy_grad=rc.entropy_coef != 0,
                                                           pixel_values=sub.pixel_values)
                out = ppo_clip_loss(
                    logp, sub.old_logp, adv[mb, :w], sub.loss_mask,
                    clip_low=rc.clip_low, clip_high=rc.clip_high, clip_c=rc.clip_c, agg=rc.loss_agg,
                    ref_logp=None if ref_logp is None else ref_logp[mb, :w], kl_coef=rc.kl_coef, kl_kind=rc.kl_kind,
                    entropy=ent, entropy_coef=rc.entropy_coef,
                    prox_logp=None if prox_logp is None else prox_logp[mb, :w], behav_cap=rc.behav_cap,
                    behav_mode=rc.behav_mode,
                )
                # Token-mean per minibatch, rescaled so every trained token of the iteration weighs the
                # same whichever (length-sorted) minibatch or piece of it it lands in.
                piece_tokens = float(sub.loss_mask.sum())
                scale = piece_tokens / tokens_per_chunk if rc.loss_agg == "token-mean" else 1.0
                (out.loss * scale).backward()
                _accumulate_terms(terms, out.terms, piece_tokens / mb_tokens if len(pieces) > 1 else 1.0)
            terms["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), rc.grad_clip))
            opt.step()
            for k, v in terms.items():
                sums[k] = sums.get(k, 0.0) + v
            n += 1
    return {k: v / max(n, 1) for k, v in sums.items()}


def _pieces(model, batch: TokenBatch, rows: Tensor, cap: int, prefix_share: int) -> list[tuple[Tensor, int]]:
    """One minibatch's passes: ``(rows, pack size)``, pack size 0 for a padded pass.

    ``rl.micro_batch_tokens`` pieces of padded rows, or with ``rl.prefix_share`` pieces in prefix
    order, each one pass over its prefix tree in the packs that cost least, whichever of the two
    costs less by :func:`arborl.policy.packed.padded_cost`: a tree packed with rows that share
    little pays attention over masked pairs that padded rows do not.
    """
    padded = micro_chunks(batch, rows, cap)
    if not prefix_share or batch.pixel_values is not None or not packed.supported(model):
        return [(p, 0) for p in padded]
    lengths = batch.attention_mask.sum(-1)
    padded_cost = packed.padded_cost(model, [(len(p), int(lengths[p].max())) for p in padded if len(p)])
    shared, shared_cost = [], 0.0
    for p in prefix_chunks(batch, rows, cap):
        size, cost = packed.best_pack_tokens(model, batch.input_ids[p], batch.attention_mask[p], prefix_share)
        shared.append((p, size))
        shared_cost += cost
    return shared if shared_cost < padded_cost else [(p, 0) for p in padded]


def _accumulate_terms(terms: dict[str, float], piece: dict[str, float], share: float) -> None:
    """Fold one piece's loss terms into its minibatch's: ``*_max`` terms by max, the others weighted by ``share``."""
    for k, v in piece.items():
        terms[k] = max(terms.get(k, v), v) if k.endswith("_max") else terms.get(k, 0.0) + share * v


@torch.no_grad()
def _ref_logprobs(ref, batch: TokenBatch, chunk: int, temperature: float, prefix_share: int = 0) -> Tensor:
    """Reference-policy log-probs of ``batch``, computed in chunks of similar lengths (``prefix_share``: over
    each chunk's prefix tree, see ``rl.prefix_share``).
    """
    out = torch.zeros_like(batch.old_logp)
    for rows, pack in (p for c in length_chunks(batch, chunk) for p in _pieces(ref, batch, c, 0, prefix_share)):
        sub = batch.select(rows)
        if pack:
            lp = packed_token_logprobs_and_entropy(ref, sub.input_ids, sub.attention_mask, temperature=temperature,
                                                   positions=sub.loss_mask, entropy_grad=False, pack_tokens=pack)[0]
        else:
            lp = token_logprobs(ref, sub.input_ids, sub.attention_mask, temperature=temperature,
                                positions=sub.loss_mask, pixel_values=sub.pixel_values)
        out[rows, : sub.input_ids.shape[1]] = lp
    return out


def recomputes_logp(cfg: TrainConfig) -> bool:
    """Whether every batch's log-probs are recomputed before the update (``rl.recompute_logp``; stale batches
    always are): ``auto`` when the sampler computes in another precision than the trainer.
    """
    mode = cfg.rl.recompute_logp
    if mode != "auto":
        return mode == "always"
    policy = cfg.policy
    return policy.rollout_dtype != "float32" or policy.backend == "vllm"


def rl_lr(rc: RLConfig, it: int) -> float:
    """Learning rate of iteration ``it`` (0-based): linear warm-up, then constant or half-cosine decay."""
    if rc.warmup_iters and it < rc.warmup_iters:
        return rc.lr * (it + 1) / rc.warmup_iters
    if rc.lr_schedule == "cosine":
        done = (it - rc.warmup_iters) / max(1, rc.iterations - rc.warmup_iters)
        return rc.lr * 0.5 * (1.0 + math.cos(math.pi * done))
    return rc.lr


def _branch_rollout_config(cfg: TrainConfig) -> RolloutConfig:
    """The rollout settings of branches: greedy continuations when ``rl.branch_greedy``."""
    sampling = cfg.rollout.sampling
    if not (cfg.rl.branch and cfg.rl.branch_greedy) or sampling.greedy:
        return cfg.rollout
    # TrainConfig has checked that the sampling temperature is 1 here
    return dataclasses.replace(cfg.rollout, sampling=dataclasses.replace(sampling, greedy=True))


@dataclasses.dataclass
class _Learner:
    """What an RL run carries from iteration to iteration."""

    model: torch.nn.Module
    tok: object
    ref: torch.nn.Module | None
    opt: torch.optim.Optimizer
    gen: torch.Generator        # sampling + minibatch order
    task_gen: torch.Generator   # which training tasks
    counters: dict[str, int]
    credit_model: CreditModel | None = None  # rl.credit's trained model (arborl.train.credit_models)


def _learner(cfg: TrainConfig, start_path: Path, resume_from: Path | None, env_steps_before: int,
             credit_model: CreditModel | None = None) -> tuple[_Learner, int]:
    """The policy, reference, optimizer and RNG streams at the start (or at checkpoint ``resume_from``)."""
    rc = cfg.rl
    device = resolve_device(cfg.policy.device)
    if credit_model is not None and device.type != "cpu":
        raise ConfigError(f"rl.credit = {rc.credit!r} trains its credit model on the CPU only; set policy.device = \"cpu\" "
                          "or choose a credit estimator without a model (grpo, rloo, gigpo, best_step, tree)")
    model, tok = load_policy(start_path, device=device)
    if cfg.policy.lora_rank:  # only the adapter trains; the reference below stays the plain start policy
        model = add_lora(model, rank=cfg.policy.lora_rank, alpha=cfg.policy.lora_alpha or None, base=start_path)
    set_training_options(model, gradient_checkpointing=cfg.policy.gradient_checkpointing, autocast=cfg.policy.autocast)
    model.eval()  # no dropout: behaviour and training log-probs must match
    ref = load_policy(start_path, device=device)[0].eval().requires_grad_(False) if rc.kl_coef > 0 else None
    opt = torch.optim.AdamW(freeze_embeddings(model, cfg.policy.frozen_embeddings), lr=rc.lr,
                            weight_decay=rc.weight_decay, betas=(0.9, 0.99))
    lrn = _Learner(model, tok, ref, opt, torch.Generator().manual_seed(cfg.seed + 2),
                   torch.Generator().manual_seed(cfg.seed + 3), {"env_steps": env_steps_before, "tokens": 0},
                   credit_model)
    if resume_from is None:
        return lrn, 0
    state = load_trainer_state(resume_from / "trainer_state.pt")
    load_weights(model, resume_from)
    opt.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"], lrn.gen)
    lrn.task_gen.set_state(state["task_rng"])
    lrn.counters = state["counters"]
    if credit_model is not None and state.get("credit_model") is not None:  # else: a run without one, fresh
        credit_model.load_state_dict(state["credit_model"])
    return lrn, state["iteration"]


def _env_actions(make_env: Callable[[], Env], cfg: TrainConfig) -> tuple[str, list[str]]:
    """The env's task type and finite action set (checked against ``rl.branch``)."""
    env = make_env()
    task_type, actions = task_type_of(env), list(getattr(env, "actions", None) or [])
    env.close()
    if cfg.rl.branch and not actions:
        raise ConfigError(f"rl.branch = true needs an env with a finite action set; {type(env).__name__} has no "
                          "`actions` attribute. Add one (the action texts step() accepts) or set rl.branch = false")
    return task_type, actions


def train_rl(
    cfg: TrainConfig,
    make_env: Callable[[], Env],
    start_path: Path,
    store,
    metrics: Metrics,
    credit: CreditFn,
    *,
    resume_from: Path | None = None,
    env_steps_before: int = 0,
    credit_model: CreditModel | None = None,
) -> Path:
    """Run ``cfg.rl.iterations`` RL iterations from the policy at ``start_path``; return the final checkpoint.

    With ``resume_from`` (an ``rl-*`` checkpoint), continue from the iteration it was written after.
    Ctrl-C stops at the end of the iteration in flight with :class:`Interrupted` after writing a
    checkpoint of it (a second Ctrl-C drops the iteration and keeps the newest checkpoint).
    ``credit_model`` (built by ``arborl.cli.CREDIT_MODELS``) feeds ``credit`` extra tensors and is
    trained after every update; its state is part of each checkpoint.
    """
    rc = cfg.rl
    lrn, start_it = _learner(cfg, start_path, resume_from, env_steps_before, credit_model)
    task_type, actions = _env_actions(make_env, cfg)
    shown: dict[str, float] = {}
    sink = BackgroundWriter(store) if rc.async_store else contextlib.nullcontext(store)
    worker = _worker(cfg, lrn, make_env, actions, task_type, start_it, start_path)
    done = start_it
    try:
        with StopRequest() as stop, sink as sink, worker or contextlib.nullcontext():
            for it in progress(range(start_it, rc.iterations), "rl", total=rc.iterations - start_it, status=shown):
                if rc.max_env_steps and lrn.counters["env_steps"] - env_steps_before >= rc.max_env_steps:
                    break  # the env-step budget is spent
                row = _iteration(cfg, it, lrn, make_env, sink, credit, task_type, actions, worker)
                done = it + 1
                metrics.log("rl", it + 1, row)
                shown.update(loss=row.get("loss/policy", 0.0), success=row["train/success"], reward=row["train/reward"])
                last = it + 1 == rc.iterations
                if stop.requested and not last:
                    raise Interrupted("rl", it + 1, _save(cfg, lrn, it + 1, sink=sink))
                if rc.checkpoint_every and (it + 1) % rc.checkpoint_every == 0 and not last:
                    _save(cfg, lrn, it + 1, sink=sink)
    except KeyboardInterrupt:  # a second Ctrl-C: the iteration in flight is dropped
        ckpt = latest_checkpoint(cfg.run_dir)
        raise Interrupted("rl", checkpoint_iteration(ckpt) if ckpt else None, ckpt) from None
    return _save(cfg, lrn, done, final=True)


def _worker(cfg: TrainConfig, lrn: _Learner, make_env: Callable[[], Env], actions: list[str], task_type: str,
            start_it: int, start_path: Path) -> RolloutWorker | RolloutProcess | None:
    """``rl.max_staleness >= 1``: the thread or process that samples ahead (None: synchronous).

    ``cluster.generation = "actor"``: the cluster's generation actors, whatever the staleness.

    It has its own sampling stream; the update's minibatch order keeps ``lrn.gen``.
    """
    rc = cfg.rl
    if cfg.cluster.generation == "actor":  # Ray actors hold the policy: synchronous, or sampling ahead
        from arborl.cluster.rollouts import ActorRollouts

        return ActorRollouts(cfg, lrn.model, start_path, actions, task_type, start=start_it, stop=rc.iterations,
                             gen=lrn.gen, task_gen=lrn.task_gen)
    if not rc.max_staleness:
        return None
    if image_spec(lrn.model) is not None:
        raise ConfigError("rl.max_staleness >= 1 is not supported for a vision policy yet: the rollout worker "
                          "has no store to put the observations' images in; set rl.max_staleness = 0")
    seed = cfg.seed + 4 + start_it
    if rc.rollout_worker == "process":
        return RolloutProcess(cfg, start_path, lrn.model, start=start_it, stop=rc.iterations,
                              max_staleness=rc.max_staleness, seed=seed, task_rng=lrn.task_gen.get_state())
    gen = torch.Generator().manual_seed(seed)

    def sample(it: int, model, version: int) -> Rollout:
        return _rollout(cfg, it, model, lrn.tok, gen, lrn.task_gen, make_env, actions, task_type, version, PhaseTimer())

    return RolloutWorker(sample, lrn.model, start=start_it, stop=rc.iterations, max_staleness=rc.max_staleness,
                         threads=cfg.threads)


def sample_in_process(cfg: TrainConfig, start_path: Path, seed: int, task_rng: Tensor) -> Callable[..., Rollout]:
    """The sampler of a :class:`RolloutProcess`: its own policy copy, env factory and random streams."""
    from arborl.train.common import env_factory

    torch.set_num_threads(cfg.threads)
    model, tok = load_policy(start_path, device=resolve_device(cfg.policy.device))
    model.requires_grad_(False)
    make_env = env_factory(cfg.env)
    task_type, actions = _env_actions(make_env, cfg)
    gen, task_gen = torch.Generator().manual_seed(seed), torch.Generator()
    task_gen.set_state(task_rng)

    def sample(it: int, weights: dict[str, Tensor] | None, version: int) -> Rollout:
        if weights is not None:
            model.load_state_dict(weights)
        return _rollout(cfg, it, model, tok, gen, task_gen, make_env, actions, task_type, version, PhaseTimer())

    return sample


def _iteration(cfg: TrainConfig, it: int, lrn: _Learner, make_env: Callable[[], Env], store, credit: CreditFn,
               task_type: str, actions: list[str], worker: RolloutWorker | RolloutProcess | None = None,
               ) -> dict[str, float]:
    """One iteration: rollout (or the ``worker``'s batch), store, credit, loss + update; returns its metrics row."""
    rc = cfg.rl
    phase = PhaseTimer()
    if worker is None:
        ro = _rollout(cfg, it, lrn.model, lrn.tok, lrn.gen, lrn.task_gen, make_env, actions, task_type, it, phase,
                      media=media_of(store))
    else:  # rl.max_staleness: sampled ahead by the worker; the wait for it is the rollout's share of the iteration
        with phase("rollout"):
            ro = worker.take(it)
    row = _learn(cfg, it, lrn, ro, store, credit, phase)
    if worker is not None:
        worker.publish(it + 1, lrn.model)
        row |= {"time/rollout_worker": sum(ro.seconds.values())}
    if rc.eval_every and ((it + 1) % rc.eval_every == 0 or it + 1 == rc.iterations):
        with phase("eval"):
            row.update(evaluate(cfg, make_env, lrn.model, lrn.tok, n=cfg.eval.probe_episodes, label="probe",
                                policy_version=it + 1))
    return {**row, **phase.row()}


def _rollout(cfg: TrainConfig, it: int, model, tok, gen: torch.Generator, task_gen: torch.Generator,
             make_env: Callable[[], Env], actions: list[str], task_type: str, version: int,
             phase: PhaseTimer, media=None) -> Rollout:
    """Iteration ``it``'s group rollouts (plus tree continuations and branches) sampled by ``model`` at ``version``.

    ``media``: where the images of observations go (the store; :func:`arborl.rollout.run_episodes`).
    """
    specs = rollout_specs(cfg, it, task_gen, task_type)
    return roll_specs(cfg, it, model, tok, gen, specs, make_env, actions, version, phase, media)


def rollout_specs(cfg: TrainConfig, it: int, task_gen: torch.Generator, task_type: str) -> list:
    """Iteration ``it``'s group specs: ``rl.tasks_per_iter`` training tasks drawn from ``task_gen``, ``rl.group_size`` each."""
    rc = cfg.rl
    # rollout: G members per task share the seed, hence the initial state
    offsets = torch.randint(0, cfg.env.train_seed_count, (rc.tasks_per_iter,), generator=task_gen).tolist()
    seeds = [cfg.env.train_seed_start + o for o in offsets]
    return specs_for(cfg, task_type, seeds, group_size=rc.group_size, group_prefix=f"rl{it}")


def roll_specs(cfg: TrainConfig, it: int, model, tok, gen: torch.Generator, specs: list,
               make_env: Callable[[], Env], actions: list[str], version: int, phase: PhaseTimer,
               media=None) -> Rollout:
    """Roll out the group ``specs`` (then their tree continuations and branches) with ``model`` at ``version``.

    The part of :func:`_rollout` after the task draw; a generation actor of the cluster
    (:mod:`arborl.cluster.rollouts`) runs it on the groups assigned to it.
    """
    rc = cfg.rl
    backend = vllm_rollout_policy if cfg.policy.backend == "vllm" else rollout_policy
    policy = backend(cfg.policy, model, tok, version, Path(cfg.run_dir) / "policy" / "serving")
    trunk_kv = PrefixCache() if rc.branch or rc.tree else None  # trunk caches for the continuations
    with phase("rollout"):
        rolled = run_episodes(policy, make_env, specs, cfg.rollout, generator=gen,
                              policy_version=version, iteration=it, source="rl", prefix_cache=trunk_kv, media=media)
    n_sampled = len(rolled)
    if rc.tree:  # k continuations re-sampled from picked turns of each group (timed with the branches)
        with phase("branch"):
            rolled += run_episodes(policy, make_env, tree_specs(rolled, k=rc.tree_k, nodes=rc.tree_nodes,
                                                                select=rc.tree_select, generator=gen),
                                   cfg.rollout, generator=gen, policy_version=version, iteration=it,
                                   source="rl-tree", prefix_cache=trunk_kv, media=media)
    if rc.branch:  # every untried action at every visited state, finished by the policy
        with phase("branch"):
            rolled += run_episodes(policy, make_env, branch_specs(rolled[:n_sampled], actions,
                                                                 max_states=rc.branch_states, generator=gen),
                                   _branch_rollout_config(cfg), generator=gen, policy_version=version, iteration=it,
                                   source="rl-branch", prefix_cache=trunk_kv, media=media)
    return Rollout(rolled, n_sampled, version, {k: phase.seconds[k] for k in ("rollout", "branch")},
                   trunk_kv.reused_tokens if trunk_kv else 0, trunk_kv.prefilled_tokens if trunk_kv else 0)


def _learn(cfg: TrainConfig, it: int, lrn: _Learner, ro: Rollout, store, credit: CreditFn,
           phase: PhaseTimer) -> dict[str, float]:
    """Store, credit and update on one rolled-out batch; returns the metrics row (without evaluation)."""
    rc = cfg.rl
    n_sampled = ro.n_sampled
    # store: persist (rl.async_store: in the background) and train on the episodes as stored
    with phase("store"):
        episodes = store_episodes(store, ro.episodes)
    # credit: one advantage per turn, broadcast to that turn's generated tokens
    with phase("credit"):
        # rl.error_policy: an episode that ended on an env error or a context overflow is no sample of the
        # policy's play; it is dropped (default) or scored 0
        broken = [failed(e) for e in episodes]
        trained = [e for e, b in zip(episodes, broken, strict=True) if not b] if rc.error_policy == "drop" else episodes
        steps = step_batch(trained, score_key=rc.score_key, invalid_penalty=cfg.rollout.invalid_action_penalty,
                           zero=broken if rc.error_policy == "zero" else None)
        groups = _kept_groups(rc, steps)  # rl.filter: the groups credit and the update see
        pad = lrn.tok.pad_token_id if lrn.tok.pad_token_id is not None else 0
        batch = collate(trained, pad_id=pad, images=image_inputs(lrn.model, store))
        ctx = None
        if lrn.credit_model is not None:  # a credit model may read the store: the writes land first
            ctx = CreditContext(cfg, it, trained, steps, batch, lrn.model, lrn.tok, readable(store))
        extra = lrn.credit_model.step_inputs(ctx) if ctx is not None else {}
        step_adv = credit_on_groups(credit, steps, groups, **extra)
        adv = broadcast(step_adv, batch.step_of_token) * batch.loss_mask
        if rc.record_advantages:  # for the explorer: run_dir/advantages.jsonl, by turn id
            record_advantages(cfg.run_dir, it, rc.credit, trained, steps.episode, steps.step, step_adv,
                              steps.step_active() & groups[steps.group[steps.episode]])
    keep = (adv.abs() > 1e-8).any(-1) if rc.drop_zero_advantage else torch.ones(len(trained), dtype=torch.bool)
    keep &= groups[steps.group]
    # loss + update (on the episodes that carry signal)
    lr = rl_lr(rc, it)
    for group in lrn.opt.param_groups:
        group["lr"] = lr
    rows = keep.nonzero()[:, 0] if it >= rc.critic_warmup else keep.nonzero()[:0, 0]  # warm-up: critic only
    terms = {}
    if len(rows):
        device = next(lrn.model.parameters()).device  # policy.device: the batch joins the model there
        kept = to_device(batch.select(rows), device)
        temp = cfg.rollout.sampling.logprob_temperature
        with phase("ref_logp"), torch_threads(rc.update_threads):
            ref_logp = None if lrn.ref is None else _ref_logprobs(lrn.ref, kept, rc.minibatch_size, temp, rc.prefix_share)
            # a stale batch (rl.max_staleness) or a sampler in another precision: decoupled PPO's proximal
            # policy is the one before this update
            prox = ro.version != it or recomputes_logp(cfg)
            prox_logp = _ref_logprobs(lrn.model, kept, rc.minibatch_size, temp, rc.prefix_share) if prox else None
        with phase("update"), torch_threads(rc.update_threads):
            terms = _update(lrn.model, lrn.opt, cfg, kept, adv[rows, : kept.input_ids.shape[1]].to(device), ref_logp,
                            lrn.gen, prox_logp)
    if ctx is not None:
        with phase("credit"):  # the credit model's training counts as credit time
            terms |= lrn.credit_model.fit(ctx)
    # metrics
    n_turns = int(steps.episode.numel())
    # env steps of experience: every rolled-out episode's own turns (dropped ones too); a continuation's
    # re-played prefix is its trunk's turns again and is counted apart
    new_turns = sum(own_turns(e) for e in ro.episodes)
    lrn.counters["env_steps"] += new_turns
    lrn.counters["replayed_steps"] = (lrn.counters.get("replayed_steps", 0)
                                      + sum(len(e.path()) for e in ro.episodes) - new_turns)
    lrn.counters["tokens"] += int(batch.loss_mask[rows].sum())  # the episodes the update used
    lrn.counters["train/filter_empty"] = lrn.counters.get("train/filter_empty", 0) + int(not groups.any())
    row = {
        **terms, **lrn.counters, "lr": lr,
        "train/success": sum(1.0 for e in episodes[:n_sampled] if e.success) / n_sampled,
        "train/reward": sum(float(e.rewards.get("return") or 0.0) for e in episodes[:n_sampled]) / n_sampled,
        "train/branches": len(episodes) - n_sampled,
        "train/prefix_reused": ro.prefix_reused,
        "train/prefix_prefilled": ro.prefix_prefilled,
        "train/invalid_frac": sum(not t.valid for e in episodes for t in e.path()) / max(1, n_turns),
        "train/turns": sum(len(e.path()) for e in episodes[:n_sampled]) / n_sampled,
        "train/adv_abs": float(adv.abs().sum() / batch.loss_mask.sum().clamp_min(1)),
        "train/kept_frac": len(rows) / len(episodes),
        "train/filter_kept_frac": float(groups.to(torch.float32).mean()) if groups.numel() else 0.0,
        "train/env_errors": sum(e.stop_reason == "env_error" for e in episodes),
        "train/max_context": sum(e.stop_reason == "max_context" for e in episodes),
        **tool_metrics(episodes[:n_sampled]),
        **{f"train/{k}": v for k, v in episode_metrics(episodes[:n_sampled]).items()},
        **_staleness(it, ro),
    }
    return row


def _staleness(it: int, ro: Rollout) -> dict[str, float]:
    """``train/staleness``: versions between the batch's sampler and the weights it updates; ``_max`` over turns."""
    lags = [it - t.policy_version for e in ro.episodes for t in e.path() if t.policy_version is not None]
    return {"train/staleness": float(it - ro.version), "train/staleness_max": float(max(lags, default=0))}


def _kept_groups(rc: RLConfig, steps: StepBatch) -> Tensor:
    """``[G]`` bool: the groups that ``rl.filter`` keeps (all of them for ``none``)."""
    if rc.filter == "starpo_s":
        return starpo_s_groups(steps, keep_ratio=rc.keep_ratio, keep_zero_std=rc.keep_zero_std)
    return torch.ones(int(steps.group.max()) + 1 if steps.group.numel() else 0, dtype=torch.bool)


def _save(cfg: TrainConfig, lrn: _Learner, iteration: int, final: bool = False, sink=None) -> Path:
    """Write checkpoint ``rl-<iteration>`` (and ``policy/rl`` when ``final``); keep ``rl.checkpoint_keep`` of them.

    The store writes still queued in ``sink`` (a :class:`BackgroundWriter`) are flushed first, so a
    checkpoint never runs ahead of the episodes stored.
    """
    flush(sink)
    path = Path(cfg.run_dir) / "checkpoints" / f"rl-{iteration:06d}"
    save_policy(lrn.model, lrn.tok, path)  # a LoRA model is written merged; its adapter beside it
    if is_lora(lrn.model):
        save_adapter(lrn.model, lrn.tok, path / "adapter")
    save_trainer_state(path / "trainer_state.pt", {
        "optimizer": lrn.opt.state_dict(), "rng": rng_state(lrn.gen), "task_rng": lrn.task_gen.get_state(),
        "iteration": iteration, "counters": dict(lrn.counters),
        **({} if lrn.credit_model is None else {"credit_model": lrn.credit_model.state_dict()}),
    })
    prune_checkpoints(cfg.run_dir, cfg.rl.checkpoint_keep)
    if final:
        save_policy(lrn.model, lrn.tok, policy_dir(cfg, "rl"))
        return policy_dir(cfg, "rl")
    return path

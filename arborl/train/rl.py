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

Implementation details (where this departs from the papers):

* Trajectory-level group statistics (not per step row; credit-spec §2).
* The invalid-action penalty is part of the episode score as well as the step reward, so a
  malformed answer lowers every token of that trajectory, not only its own turn.
* ``length_neutral`` (default on) gives each episode the same total weight whatever its length;
  without it, tokens that appear in every turn (the end-of-turn token) drift with
  ``sum_i A_i T_i`` and the format erodes (observed: collapse to 0 success at lr 2e-3).
* Checkpoints hold weights, optimizer state, every RNG stream and the counters, so
  ``--resume`` continues exactly where the run stopped.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from arborl.credit import StepBatch
from arborl.env import Env
from arborl.loss import ppo_clip_loss
from arborl.policy import ChatRenderer, load_policy, save_policy, token_logprobs, token_logprobs_and_entropy
from arborl.rollout import ModelPolicy, RolloutConfig, run_episodes
from arborl.rollout.branch import branch_specs
from arborl.train.batch import TokenBatch, broadcast, collate, length_chunks, step_batch
from arborl.train.common import (
    Metrics,
    load_trainer_state,
    rng_state,
    save_trainer_state,
    set_rng_state,
    task_type_of,
)
from arborl.train.config import RLConfig, TrainConfig
from arborl.train.progress import progress
from arborl.train.stages import evaluate, policy_dir, specs_for

CreditFn = Callable[[StepBatch], Tensor]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete RL checkpoint directory, or None."""
    root = Path(run_dir) / "checkpoints"
    done = sorted(p for p in root.glob("rl-*") if (p / "trainer_state.pt").exists()) if root.exists() else []
    return done[-1] if done else None


def _update(model, opt, cfg: TrainConfig, batch: TokenBatch, adv: Tensor, ref_logp: Tensor | None,
            gen: torch.Generator) -> dict[str, float]:
    """``ppo_epochs`` passes of minibatch PPO-clip steps over one iteration's batch."""
    rc, temp = cfg.rl, cfg.rollout.sampling.logprob_temperature
    sums: dict[str, float] = {}
    n = 0
    chunks = length_chunks(batch, rc.minibatch_size)
    tokens_per_chunk = max(float(batch.loss_mask.sum()) / len(chunks), 1.0)
    for _ in range(rc.ppo_epochs):
        for c in torch.randperm(len(chunks), generator=gen).tolist():
            mb = chunks[c]
            sub = batch.select(mb)
            w = sub.input_ids.shape[1]
            logp, ent = token_logprobs_and_entropy(model, sub.input_ids, sub.attention_mask, temperature=temp)
            out = ppo_clip_loss(
                logp, sub.old_logp, adv[mb, :w], sub.loss_mask,
                clip_low=rc.clip_low, clip_high=rc.clip_high, clip_c=rc.clip_c, agg=rc.loss_agg,
                ref_logp=None if ref_logp is None else ref_logp[mb, :w], kl_coef=rc.kl_coef, kl_kind=rc.kl_kind,
                entropy=ent, entropy_coef=rc.entropy_coef,
            )
            opt.zero_grad(set_to_none=True)
            # Token-mean per minibatch, rescaled so every trained token of the iteration weighs the
            # same whichever (length-sorted) minibatch it lands in.
            scale = float(sub.loss_mask.sum()) / tokens_per_chunk if rc.loss_agg == "token-mean" else 1.0
            (out.loss * scale).backward()
            out.terms["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), rc.grad_clip))
            opt.step()
            for k, v in out.terms.items():
                sums[k] = sums.get(k, 0.0) + v
            n += 1
    return {k: v / max(n, 1) for k, v in sums.items()}


@torch.no_grad()
def _ref_logprobs(ref, batch: TokenBatch, chunk: int, temperature: float) -> Tensor:
    """Reference-policy log-probs of ``batch``, computed in chunks of similar lengths."""
    out = torch.zeros_like(batch.old_logp)
    for rows in length_chunks(batch, chunk):
        sub = batch.select(rows)
        out[rows, : sub.input_ids.shape[1]] = token_logprobs(ref, sub.input_ids, sub.attention_mask,
                                                             temperature=temperature)
    return out


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


def train_rl(
    cfg: TrainConfig,
    make_env: Callable[[], Env],
    start_path: Path,
    store,
    metrics: Metrics,
    credit: CreditFn,
    *,
    resume: bool = False,
    env_steps_before: int = 0,
) -> Path:
    """Run ``cfg.rl.iterations`` RL iterations from the policy at ``start_path``; return the final checkpoint."""
    rc = cfg.rl
    model, tok = load_policy(start_path)
    model.eval()  # no dropout: behaviour and training log-probs must match
    ref = load_policy(start_path)[0].eval().requires_grad_(False) if rc.kl_coef > 0 else None
    opt = torch.optim.AdamW(model.parameters(), lr=rc.lr, weight_decay=rc.weight_decay, betas=(0.9, 0.99))
    gen = torch.Generator().manual_seed(cfg.seed + 2)        # sampling + minibatch order
    task_gen = torch.Generator().manual_seed(cfg.seed + 3)   # which training tasks
    start_it, counters = 0, {"env_steps": env_steps_before, "tokens": 0}
    ckpt = latest_checkpoint(cfg.run_dir) if resume else None
    if resume and ckpt is None:
        raise FileNotFoundError(f"--resume: no RL checkpoint under {cfg.run_dir}/checkpoints; run without --resume")
    if ckpt is not None:
        state = load_trainer_state(ckpt / "trainer_state.pt")
        model.load_state_dict(load_policy(ckpt)[0].state_dict())
        opt.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"], gen)
        task_gen.set_state(state["task_rng"])
        start_it, counters = state["iteration"], state["counters"]
    renderer = ChatRenderer(tok, cfg.policy.system_prompt or None)
    env = make_env()
    task_type = task_type_of(env)
    actions = list(getattr(env, "actions", None) or [])
    env.close()
    if rc.branch and not actions:
        raise ValueError(f"rl.branch = true needs an env with a finite action set; {type(env).__name__} has no "
                         "`actions` attribute. Add one (the action texts step() accepts) or set rl.branch = false")
    branch_cfg = _branch_rollout_config(cfg)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0

    for it in progress(range(start_it, rc.iterations), "rl", total=rc.iterations - start_it):
        # rollout: G members per task share the seed, hence the initial state
        offsets = torch.randint(0, cfg.env.train_seed_count, (rc.tasks_per_iter,), generator=task_gen).tolist()
        seeds = [cfg.env.train_seed_start + o for o in offsets]
        specs = specs_for(cfg, task_type, seeds, group_size=rc.group_size, group_prefix=f"rl{it}")
        policy = ModelPolicy(model, renderer)
        rolled = run_episodes(policy, make_env, specs, cfg.rollout, generator=gen,
                              policy_version=it, iteration=it, source="rl")
        n_sampled = len(rolled)
        if rc.branch:  # every untried action at every visited state, finished by the policy
            rolled += run_episodes(policy, make_env, branch_specs(rolled, actions), branch_cfg, generator=gen,
                                   policy_version=it, iteration=it, source="rl-branch")
        # store: persist, then train on what the store returns
        ids = store.put_many(rolled)
        episodes = store.get_many(ids)
        # credit: one advantage per turn, broadcast to that turn's generated tokens
        steps = step_batch(episodes, score_key=rc.score_key, invalid_penalty=cfg.rollout.invalid_action_penalty)
        batch = collate(episodes, pad_id=pad)
        adv = broadcast(credit(steps), batch.step_of_token) * batch.loss_mask
        keep = (adv.abs() > 1e-8).any(-1) if rc.drop_zero_advantage else torch.ones(len(episodes), dtype=torch.bool)
        # loss + update (on the episodes that carry signal)
        for group in opt.param_groups:
            group["lr"] = rl_lr(rc, it)
        rows = keep.nonzero()[:, 0]
        terms = {}
        if len(rows):
            kept = batch.select(rows)
            ref_logp = None if ref is None else _ref_logprobs(ref, kept, rc.minibatch_size,
                                                              cfg.rollout.sampling.logprob_temperature)
            terms = _update(model, opt, cfg, kept, adv[rows, : kept.input_ids.shape[1]], ref_logp, gen)
        # metrics
        n_turns = int(steps.episode.numel())
        counters["env_steps"] += n_turns
        counters["tokens"] += int(batch.loss_mask.sum())
        row = {
            **terms, **counters,
            "train/success": sum(1.0 for e in episodes[:n_sampled] if e.success) / n_sampled,
            "train/branches": len(episodes) - n_sampled,
            "train/invalid_frac": sum(not t.valid for e in episodes for t in e.path()) / max(1, n_turns),
            "train/turns": sum(len(e.path()) for e in episodes[:n_sampled]) / n_sampled,
            "train/adv_abs": float(adv.abs().sum() / batch.loss_mask.sum().clamp_min(1)),
            "train/kept_frac": len(rows) / len(episodes),
        }
        if rc.eval_every and ((it + 1) % rc.eval_every == 0 or it + 1 == rc.iterations):
            row.update(evaluate(cfg, make_env, model, tok, n=cfg.eval.probe_episodes, label="probe", policy_version=it + 1))
        metrics.log("rl", it + 1, row)
        if rc.checkpoint_every and (it + 1) % rc.checkpoint_every == 0 and it + 1 < rc.iterations:
            _save(cfg, model, tok, opt, gen, task_gen, it + 1, counters)
    return _save(cfg, model, tok, opt, gen, task_gen, rc.iterations, counters, final=True)


def _save(cfg, model, tok, opt, gen, task_gen, iteration: int, counters: dict, final: bool = False) -> Path:
    path = Path(cfg.run_dir) / "checkpoints" / f"rl-{iteration:06d}"
    save_policy(model, tok, path)
    save_trainer_state(path / "trainer_state.pt", {
        "optimizer": opt.state_dict(), "rng": rng_state(gen), "task_rng": task_gen.get_state(),
        "iteration": iteration, "counters": dict(counters),
    })
    if final:
        save_policy(model, tok, policy_dir(cfg, "rl"))
        return policy_dir(cfg, "rl")
    return path

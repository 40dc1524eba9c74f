"""Stages that prepare a policy and collect episodes: policy init, synthesis, evaluation.

Each is a plain function of the config and the run directory; the trainers in ``sft.py`` and
``rl.py`` call them, and ``pipeline.py`` chains them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from arborl.env import Env
from arborl.policy import (
    ChatRenderer,
    build_model,
    load_policy,
    observation_text,
    save_policy,
    train_tokenizer,
)
from arborl.policy.vision import image_spec
from arborl.rollout import EpisodeSpec, ModelPolicy, RolloutConfig, ScriptedPolicy, run_episodes
from arborl.rollout.media import MemoryMedia, media_of
from arborl.tools.metrics import episode_metrics
from arborl.train.common import task_type_of
from arborl.train.config import TrainConfig
from arborl.train.embeddings import redraw_embeddings
from arborl.train.interrupt import between_steps
from arborl.train.progress import progress
from arborl.trajectory import Episode


def policy_dir(cfg: TrainConfig, name: str) -> Path:
    """``run_dir/policy/<name>``: the ``init``, ``sft`` or ``rl`` checkpoint of the run."""
    return Path(cfg.run_dir) / "policy" / name


def _corpus(make_env: Callable[[], Env], episodes: int, seed_start: int, seed: int) -> tuple[list[str], list[str]]:
    """Observation texts and action words from expert-guided, partly random play.

    Actions are the expert's (a random one of ``env.actions`` for an env without an expert),
    replaced with probability 0.3 by another action word seen so far (or by a malformed one), so
    the corpus covers off-path states and invalid-action feedback. Every declared action word is
    in the result, so a from-scratch tokenizer knows it.
    """
    rng = random.Random(seed)
    env = make_env()
    texts: list[str] = []
    known = [str(a) for a in getattr(env, "actions", ())]  # an env's declared action words, if any
    actions: list[str] = []
    try:
        for k in range(episodes):
            obs, _ = env.reset(seed=seed_start + k)
            texts.append(observation_text(env.format_observation(obs)))
            for _ in range(64):
                expert = getattr(env, "expert_action", None)
                act = expert() if expert is not None else rng.choice(known) if known else "noop"
                if act not in actions:
                    actions.append(act)
                roll = rng.random()
                if roll < 0.3 and actions:
                    act = rng.choice(actions)
                elif roll < 0.33:
                    act = "???"
                res = env.step(act)
                texts.append(observation_text(env.format_observation(res.obs)))
                if res.terminated or res.truncated:
                    break
        words = [str(w) for w in getattr(env, "vocabulary", ())]  # words an env's tasks may hold that play missed
    finally:
        env.close()
    return texts, actions + [a for a in known + words if a not in actions]  # words play never reached, too


def prepare_policy(cfg: TrainConfig, make_env: Callable[[], Env]) -> Path:
    """Build (scratch) or validate (local path) the initial policy; return its dir."""
    out = policy_dir(cfg, "init")
    if (out / "config.json").exists():
        return out
    if cfg.policy.init != "scratch":
        model, tok = load_policy(cfg.policy.init)
        save_policy(model, tok, out)
        return out
    texts, actions = _corpus(make_env, cfg.policy.tokenizer_episodes, cfg.env.train_seed_start, cfg.seed)
    corpus = texts + actions + ([cfg.policy.system_prompt] if cfg.policy.system_prompt else [])
    tok = train_tokenizer(corpus, extra_words=actions, kind=cfg.policy.tokenizer,
                          vocab_size=cfg.policy.tokenizer_vocab_size)
    model = build_model(cfg.policy.model, tok, seed=cfg.seed)
    if cfg.policy.frozen_embeddings:
        redraw_embeddings(model, cfg.policy.frozen_embeddings, seed=cfg.seed)
    save_policy(model, tok, out)
    return out


def specs_for(
    cfg: TrainConfig, task_type: str, seeds: list[int], *, group_size: int = 1, group_prefix: str = "g"
) -> list[EpisodeSpec]:
    """One spec per (seed, member): members of a group share the seed, hence the initial state."""
    return [
        EpisodeSpec(task_id=f"{task_type}-{s}", task_type=task_type, group_id=f"{group_prefix}-{s}", seed=s)
        for s in seeds
        for _ in range(group_size)
    ]


def synthesize(cfg: TrainConfig, make_env: Callable[[], Env], policy_path: Path, store, *,
               act: Callable[[Env], str] | None = None, source: str = "synth", episodes: int | None = None,
               only_successful: bool | None = None, seed_start: int | None = None) -> list[Episode]:
    """Expert episodes rendered through the policy's chat template, stored with ``source`` ("synth").

    ``act`` replaces the env's expert (the mid-training set uses a noisy one); ``episodes``,
    ``only_successful`` and ``seed_start`` default to ``synth.episodes``, ``synth.only_successful``
    and ``env.train_seed_start``.
    """
    model, tok = load_policy(policy_path)
    renderer = ChatRenderer(tok, cfg.policy.system_prompt or None)
    images = image_spec(model)  # a vision policy's placeholders: demonstrations get its token layout

    def expert(env: Env) -> str:
        fn = getattr(env, "expert_action", None)
        if fn is None:
            raise ValueError(f"{type(env).__name__} has no expert_action(); synth needs an env that can act as its own expert")
        return fn()

    env = make_env()
    task_type = task_type_of(env)
    env.close()
    first = cfg.env.train_seed_start if seed_start is None else seed_start
    seeds = [first + k for k in range(cfg.synth.episodes if episodes is None else episodes)]
    specs = specs_for(cfg, task_type, seeds, group_prefix=source)
    gen = torch.Generator().manual_seed(cfg.seed)
    shown: dict[str, float] = {}
    size = cfg.rollout.batch_size  # one engine batch per bar step; the scripted expert draws no random numbers
    chunks = [specs[i:i + size] for i in range(0, len(specs), size)]
    out: list[Episode] = []
    for chunk in between_steps(progress(chunks, source, status=shown)):
        out += run_episodes(ScriptedPolicy(act or expert, renderer, images=images), make_env, chunk, cfg.rollout,
                            generator=gen, policy_version=0, iteration=-1, source=source, media=media_of(store))
        shown.update(episodes=len(out), success=sum(1.0 for e in out if e.success) / len(out),
                     reward=sum(float(e.rewards.get("return") or 0.0) for e in out) / len(out))
    if cfg.synth.only_successful if only_successful is None else only_successful:
        out = [e for e in out if e.success]
    store.put_many(out)
    return out


def evaluate(
    cfg: TrainConfig,
    make_env: Callable[[], Env],
    model,
    tokenizer,
    *,
    n: int,
    store=None,
    label: str = "eval",
    policy_version: int = 0,
) -> dict[str, float]:
    """Greedy (or sampled) rollouts on ``n`` held-out tasks; success rate and mean return."""
    env = make_env()
    task_type, extra = task_type_of(env), getattr(env, "episode_metrics", None)  # an env's own figures, e.g. FinQA's
    env.close()
    seeds = [cfg.env.eval_seed_start + k for k in range(n)]
    rcfg: RolloutConfig = cfg.rollout
    if cfg.eval.greedy:
        rcfg = replace(rcfg, sampling=replace(rcfg.sampling, greedy=True))
    renderer = ChatRenderer(tokenizer, cfg.policy.system_prompt or None)
    gen = torch.Generator().manual_seed(cfg.seed + 7)
    eps = run_episodes(ModelPolicy(model, renderer), make_env, specs_for(cfg, task_type, seeds, group_prefix=label),
                       rcfg, generator=gen, policy_version=policy_version, iteration=-1, source=label,
                       media=MemoryMedia() if store is None else media_of(store))
    if store is not None:
        store.put_many(eps)
    n_eps = max(len(eps), 1)
    return {
        **episode_metrics(eps),  # what a tool env reports per episode (arborl.tools.metrics), e.g. f1
        **(extra(eps) if callable(extra) else {}),  # an env's own figures over the episodes, e.g. FinQA's
        "success": sum(1.0 for e in eps if e.success) / n_eps,
        "reward": sum(float(e.rewards.get("return") or 0.0) for e in eps) / n_eps,
        "turns": sum(len(e.path()) for e in eps) / n_eps,
        "invalid_frac": sum(sum(not t.valid for t in e.path()) for e in eps) / max(1, sum(len(e.path()) for e in eps)),
    }

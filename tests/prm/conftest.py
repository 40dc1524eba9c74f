"""FrozenLake episodes in a real SQLite store, and the iteration context a reward model sees.

Each group (one map seed) has two expert members, which mostly reach the goal, and two that walk
at random, which mostly fall into a hole or run out of turns: success and failure paths share the
start state and then part ways.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from arborl.config import load_config
from arborl.credit import StepBatch
from arborl.policy import ChatRenderer, load_policy
from arborl.rollout import run_episodes
from arborl.rollout.policy import ScriptedPolicy
from arborl.store import open_store
from arborl.train.batch import collate, step_batch
from arborl.train.common import env_factory
from arborl.train.config import TrainConfig
from arborl.train.credit_models import CreditContext
from arborl.train.stages import prepare_policy, specs_for

ROOT = Path(__file__).resolve().parents[2]
SEEDS = list(range(8))


def tiny_config(run_dir: Path, *extra: str) -> TrainConfig:
    """examples/tiny.toml in ``run_dir``, with ``extra`` overrides."""
    return load_config(TrainConfig, ROOT / "examples" / "tiny.toml",
                       [f'run_dir="{run_dir}"', "report_to=[]", "rl.branch=false", *extra])


@pytest.fixture(scope="session")
def lake(tmp_path_factory):
    """(cfg, policy, tok, store_url, episodes) with the episodes stored as iteration-0 RL rollouts."""
    run = tmp_path_factory.mktemp("prm-lake") / "run"
    cfg = tiny_config(run)
    make_env = env_factory(cfg.env)
    policy, tok = load_policy(prepare_policy(cfg, make_env))
    renderer, rng = ChatRenderer(tok, None), random.Random(0)
    experts, walkers = (ScriptedPolicy(fn, renderer) for fn in (lambda env: env.expert_action(),
                                                                 lambda env: rng.choice(env.actions)))
    episodes = []
    for pol in (experts, walkers):  # two of each per group: the same group ids, hence the same start state
        specs = specs_for(cfg, "frozenlake", SEEDS, group_size=2, group_prefix="rl0")
        episodes += run_episodes(pol, make_env, specs, cfg.rollout, generator=torch.Generator().manual_seed(0),
                                 iteration=0, source="rl")
    url = f"sqlite:///{run.parent / 'traj.db'}"
    with open_store(url) as store:
        stored = store.get_many(store.put_many(episodes))
    assert 0 < sum(bool(e.success) for e in stored) < len(stored)
    return cfg, policy, tok, url, stored


def context(cfg: TrainConfig, policy, tok, store, episodes, iteration: int = 0) -> CreditContext:
    """The context an RL iteration hands a credit model, built from ``episodes``."""
    steps: StepBatch = step_batch(episodes, score_key=cfg.rl.score_key,
                                  invalid_penalty=cfg.rollout.invalid_action_penalty)
    batch = collate(episodes, pad_id=tok.pad_token_id if tok.pad_token_id is not None else 0)
    return CreditContext(cfg, iteration, list(episodes), steps, batch, policy, tok, store)


def success_gap(scores: torch.Tensor, ctx: CreditContext) -> float:
    """Mean score of the steps of successful episodes minus that of the failed ones."""
    won = torch.tensor([bool(e.success) for e in ctx.episodes])[ctx.steps.episode]
    return float(scores[won].mean() - scores[~won].mean())


def with_rl(cfg: TrainConfig, **kw) -> TrainConfig:
    """``cfg`` with these ``rl`` keys changed."""
    return dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, **kw))


def lake_context(lake, **rl) -> tuple[TrainConfig, CreditContext]:
    """The config (with ``rl`` overrides) and the iteration context of the stored lake episodes."""
    cfg, policy, tok, url, episodes = lake
    cfg = with_rl(cfg, **rl)
    with open_store(url) as store:
        return cfg, context(cfg, policy, tok, store, episodes)

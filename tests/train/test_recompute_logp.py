"""``rl.recompute_logp``: when the update recomputes the batch's log-probs, and what it measures then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arborl.config import ConfigError, load_config
from arborl.train.config import TrainConfig
from arborl.train.rl import recomputes_logp
from tests.e2e.clikit import arborl

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.toml"


def _cfg(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, TINY, list(overrides))


@pytest.mark.parametrize(("overrides", "expected"), [
    ((), False),  # the local float32 engine: its log-probs are the trainer's
    (('policy.rollout_dtype="bfloat16"',), True),
    (('policy.autocast="bf16"',), False),  # a no-grad recomputation is float32 like the sampler: nothing to gain
    (('rl.recompute_logp="always"',), True),
    (('policy.rollout_dtype="bfloat16"', 'rl.recompute_logp="never"'), False),
])
def test_auto_recomputes_when_the_sampler_computes_otherwise(overrides, expected):
    assert recomputes_logp(_cfg(*overrides)) is expected


def test_bad_combinations_are_refused_with_the_fix():
    with pytest.raises(ValueError, match='recompute_logp = "never".*max_staleness.*"auto"'):
        _cfg('rl.recompute_logp="never"', "rl.max_staleness=1")
    with pytest.raises(ConfigError, match='rollout_dtype = "bfloat16".*backend = "http".*"float32"'):
        _cfg('policy.rollout_dtype="bfloat16"', 'policy.backend="http"', 'policy.urls=["http://127.0.0.1:9"]')
    with pytest.raises(ValueError, match="rollout_dtype"):
        _cfg('policy.rollout_dtype="float16"')


def _train(run_dir: Path, *overrides: str) -> list[dict]:
    sets = [a for o in ("rl.iterations=2", "eval.episodes=4", "report_to=[]", f'run_dir="{run_dir}"', *overrides)
            for a in ("--set", o)]
    arborl("train", str(TINY), *sets)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("stage") == "rl"]


def test_float32_rollouts_recomputed_give_back_their_own_logprobs(tmp_path):
    """The invariant inside the loop: a fresh float32 batch's recorded log-probs are the trainer's."""
    rl = _train(tmp_path / "f32", 'rl.recompute_logp="always"')
    assert len(rl) == 2
    for row in rl:
        assert row["diag/behav_logp_gap"] < 1e-5
        assert abs(row["diag/behav_weight_mean"] - 1) < 1e-5 and row["diag/behav_trunc_frac"] == 0


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_bf16_rollouts_train_with_the_correction(tmp_path, mode):
    # behav_cap 1.0002: a band narrow enough that some bf16 tokens leave it (gaps ~0.0005 nats)
    rl = _train(tmp_path / "bf16", 'policy.rollout_dtype="bfloat16"', f'rl.behav_mode="{mode}"', "rl.behav_cap=1.0002")
    assert len(rl) == 2
    for row in rl:
        assert 1e-5 < row["diag/behav_logp_gap"] < 0.05  # another precision: near, not equal
        assert abs(row["diag/behav_weight_mean"] - 1) < 0.05
        assert 0 < row["diag/behav_trunc_frac"] < 1  # some tokens past the cap (masked: or under 1 / cap)
        assert row["grad_norm"] > 0

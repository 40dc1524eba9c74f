"""The engine's speed work is exact: the same seed gives bit-for-bit the trajectories it gave before.

The fingerprints were recorded with the engine as it was before its cache rows were reused and
its buffers left uninitialised where nothing reads them; any change to the sampled tokens, their
log-probs, or the random stream moves them. The ``forced`` case forces a first action without a
shared prefix (continuations with a prefix have no counterpart in the engine the fingerprints
were recorded with; tests/rollout/test_branch.py and test_tree.py cover them).
"""

from __future__ import annotations

import hashlib
import struct

import pytest
import torch

from arborl.rollout import EpisodeSpec, ModelPolicy, RolloutConfig, SamplingConfig, run_episodes

from .conftest import CountEnv

GOLDEN = {
    "sampled": "f28bafc19c1307ed",
    "top_p": "786103517edc6098",
    "forced": "27a076c52b5d5948",
}


def _fingerprint(episodes) -> str:
    h = hashlib.sha256()
    for ep in episodes:
        for t in ep.path():
            h.update(struct.pack(f"{len(t.output_ids)}q", *t.output_ids))
            h.update(struct.pack(f"{len(t.output_logprobs)}d", *t.output_logprobs))
            h.update(struct.pack(f"{len(t.prompt_ids)}q", *t.prompt_ids))
    return h.hexdigest()[:16]


def _run(model, renderer, case: str):
    # more specs than slots, episodes of different lengths: rows are released and refilled and the
    # cache is compacted along the way
    sampling = SamplingConfig(max_new_tokens=3, temperature=1.0, top_p=0.9 if case == "top_p" else 1.0)
    cfg = RolloutConfig(max_turns=6, max_context_tokens=1000, sampling=sampling, batch_size=5)
    specs = []
    for i in range(17):
        forced = {}
        if case == "forced" and i % 3 == 0:
            forced = {"branch_action": "left"}
        specs.append(EpisodeSpec(f"t{i}", "count", f"g{i // 4}", seed=i, options={"length": 2 + i % 5}, **forced))
    return run_episodes(ModelPolicy(model, renderer), CountEnv, specs, cfg, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_same_seed_same_trajectories_as_before(model, renderer, case):
    assert _fingerprint(_run(model, renderer, case)) == GOLDEN[case]

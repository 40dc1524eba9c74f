"""The engine's speed work is exact: the same seed gives bit-for-bit the trajectories it gave before.

The fingerprints were recorded with the engine as it was before its cache rows were reused and
its buffers left uninitialised where nothing reads them; any change to the sampled tokens, their
log-probs, or the random stream moves them. The ``forced`` case forces a first action without a
shared prefix (continuations with a prefix have no counterpart in the engine the fingerprints
were recorded with; tests/rollout/test_branch.py and test_tree.py cover them).

Float rounding is the CPU's: the same code gives other sampled tokens where the BLAS library takes
other kernels (MKL on an Intel and on an AMD AVX-512 core differ). Fingerprints are therefore kept
per platform, keyed by :func:`_numerics`, a hash of the test model's plain forward on fixed inputs;
on a platform with no record the test skips and names the key and the fingerprints to add. That
the engine's own forward equals the generic one is checked on every platform by
``tests/rollout/test_decoder.py``.
"""

from __future__ import annotations

import hashlib
import struct

import pytest
import torch

from arborl.rollout import EpisodeSpec, ModelPolicy, RolloutConfig, SamplingConfig, run_episodes

from .conftest import CountEnv

CASES = ("forced", "sampled", "top_p")

GOLDEN = {
    # the first record, on an Intel AVX-512 machine, MKL 2024.2, before platforms were keyed
    "unkeyed-intel-avx512": {"sampled": "f28bafc19c1307ed", "top_p": "786103517edc6098", "forced": "27a076c52b5d5948"},
    # AMD EPYC (AVX-512), torch 2.13.0's bundled MKL; the same code as the record above
    "cf63c8956168": {"sampled": "cd4b500937ccaf44", "top_p": "f215119d4efe901b", "forced": "635c0f4189aaee65"},
}
"""Platform key (:func:`_numerics`) -> case -> fingerprint of :func:`_run`."""


def _numerics(model) -> str:
    """A key for how this CPU rounds the test model's arithmetic: its plain forward on fixed inputs, hashed."""
    ids = torch.randint(1, model.config.vocab_size, (5, 23), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits
    return hashlib.sha256(logits.numpy().tobytes()).hexdigest()[:12]


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


@pytest.mark.parametrize("case", CASES)
def test_same_seed_same_trajectories_as_before(model, renderer, case):
    got, key = _fingerprint(_run(model, renderer, case)), _numerics(model)
    if key in GOLDEN:
        assert got == GOLDEN[key][case]
    elif got not in {record[case] for record in GOLDEN.values()}:
        pytest.skip(f"no fingerprints recorded for numerics {key!r}: add GOLDEN[{key!r}][{case!r}] = {got!r} "
                    "once the engine is known to be unchanged")

"""Mid-training: packing layout, no attention across documents, every token trained (SFT: outputs only)."""

from __future__ import annotations

import random

import pytest
import torch

from arborl.config import ConfigError, load_config
from arborl.env.envs import FrozenLake
from arborl.loss import sft_loss
from arborl.policy import ChatRenderer, ModelConfig, build_model, train_tokenizer
from arborl.rollout import EpisodeSpec, ModelPolicy, run_episodes
from arborl.train.batch import collate
from arborl.train.config import TrainConfig
from arborl.train.midtrain import document, logprobs_from_logits, mixture, pack, packed_logprobs
from arborl.trajectory import linearize

SMALL = ModelConfig(hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=2)


@pytest.fixture(scope="module")
def policy():
    env = FrozenLake(size=4)
    corpus = [env.format_observation(env.reset(seed=s)[0]) for s in range(30)]
    tok = train_tokenizer(corpus, extra_words=["Left", "Down", "Right", "Up"])
    return build_model(SMALL, tok, seed=0).eval(), tok


@pytest.fixture(scope="module")
def episodes(policy):
    model, tok = policy
    cfg = load_config(TrainConfig, None, ["rollout.max_turns=3", "rollout.sampling.max_new_tokens=3"])
    specs = [EpisodeSpec(task_id=f"t{i}", task_type="frozenlake", group_id=f"g{i}", seed=i) for i in range(4)]
    return run_episodes(ModelPolicy(model, ChatRenderer(tok)), lambda: FrozenLake(size=4), specs, cfg.rollout,
                        generator=torch.Generator().manual_seed(0))


def test_pack_layout_by_hand():
    b = pack([[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11, 12]], 5, pad_id=0)
    # row 0: doc 0 (1 2 3) + doc 1 (4 5); row 1: the first 5 tokens of doc 2; row 2: its last 2, padded
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 0, 0, 0]]
    assert b.position_ids.tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 4], [0, 1, 0, 0, 0]]
    assert b.doc.tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0], [0, 0, -1, -1, -1]]
    # every token is trained except each document's first (nothing before it) and padding
    assert b.loss_mask.tolist() == [[0, 1, 1, 0, 1], [0, 1, 1, 1, 1], [0, 1, 0, 0, 0]]


def test_attention_bias_is_block_diagonal_causal():
    b = pack([[1, 2], [3, 4, 5]], 6)
    allowed = (b.attention_bias()[0, 0] == 0).int().tolist()
    assert allowed == [[1, 0, 0, 0, 0, 0],
                       [1, 1, 0, 0, 0, 0],
                       [0, 0, 1, 0, 0, 0],
                       [0, 0, 1, 1, 0, 0],
                       [0, 0, 1, 1, 1, 0],
                       [0, 0, 0, 0, 0, 1]]  # the padding query sees only itself


def test_a_packed_document_has_the_logits_it_has_alone(policy, episodes):
    model, _ = policy
    d1, d2 = document(episodes[0]), document(episodes[1])
    t = len(d1) + len(d2)
    with torch.no_grad():
        packed = pack([d1, d2], t)
        assert packed.input_ids.shape[0] == 1  # both in one row
        together = model(input_ids=packed.input_ids, attention_mask=packed.attention_bias(),
                         position_ids=packed.position_ids).logits[0, len(d1):]
        alone = model(input_ids=torch.tensor([d2])).logits[0]
        torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
        # the attack the mask stops: plain causal attention over the row lets doc 2 read doc 1
        leaky = model(input_ids=packed.input_ids).logits[0, len(d1):]
        assert (leaky - alone).abs().max() > 1e-3
        lp_packed = packed_logprobs(model, packed)[0, len(d1):]
        lp_alone = packed_logprobs(model, pack([d2], len(d2)))[0]
        torch.testing.assert_close(lp_packed, lp_alone, atol=1e-5, rtol=1e-5)


def test_midtrain_trains_every_token_and_sft_only_the_outputs(policy, episodes):
    model, tok = policy
    docs = [document(e) for e in episodes]
    width = max(map(len, docs))
    packed = pack(docs, width)  # one document per row here, so rows line up with collate's
    sft = collate(episodes, pad_id=tok.pad_token_id)
    assert torch.equal(packed.input_ids[:, : sft.input_ids.shape[1]], sft.input_ids)
    with torch.no_grad():
        logits = model(input_ids=packed.input_ids).logits
    prompt = torch.zeros_like(packed.loss_mask, dtype=torch.bool)
    for i, e in enumerate(episodes):
        m = torch.tensor(linearize(e).loss_mask)
        prompt[i, : len(m)] = m == 0
    prompt[:, 0] = False  # position 0 is predicted from nothing, in both
    assert prompt.sum() > 50  # observations are most of a FrozenLake trajectory
    grads = {}
    for name, mask in (("midtrain", packed.loss_mask), ("sft", torch.nn.functional.pad(sft.loss_mask, (0, width - sft.loss_mask.shape[1])))):
        leaf = logits.clone().requires_grad_()
        sft_loss(logprobs_from_logits(leaf, packed), mask).loss.backward()
        g = leaf.grad.abs().sum(-1)  # (B, T): gradient at the logits that predict token t + 1
        grads[name] = torch.nn.functional.pad(g[:, :-1], (1, 0))  # aligned to the predicted token
    observed = grads["midtrain"][prompt]
    assert (observed > 0).all(), "mid-training must train on every observation token"
    assert (grads["sft"][prompt] == 0).all(), "SFT must not train on observation tokens"
    trained = sft.loss_mask > 0
    assert (grads["sft"][:, : trained.shape[1]][trained] > 0).all()


def test_mixture_draws_sources_by_weight():
    srcs = [[[1]], [[2]], [[3]]]
    docs = mixture(srcs, [0.6, 0.3, 0.1], 10_000, random.Random(0))
    share = [sum(d == [k] for d in docs) / len(docs) for k in (1, 2, 3)]
    assert share == pytest.approx([0.6, 0.3, 0.1], abs=0.02)
    assert mixture(srcs, [0, 1, 0], 50, random.Random(0)) == [[2]] * 50


def test_midtrain_config_checks_its_weights():
    with pytest.raises(ConfigError, match="one non-negative weight per midtrain.data"):
        load_config(TrainConfig, None, ['midtrain.data=["store:a", "store:b"]', "midtrain.weights=[1.0]"])
    with pytest.raises(ConfigError, match="unknown"):
        load_config(TrainConfig, None, ['stages=["synth", "pretrain"]'])


def test_a_run_dir_with_a_midtrain_or_merge_policy_is_not_overwritten_silently(tmp_path):
    from arborl.train.rundir import RunDir

    rd = RunDir(tmp_path, default_store=True)
    for stage in ("midtrain", "merge"):
        (tmp_path / "policy" / stage).mkdir(parents=True)
        with pytest.raises(ConfigError, match=f"already holds {stage} output"):
            rd.plan([stage], rl_iterations=1, resume=False, overwrite=False)
        rd.mark_finished(stage)
        assert rd.plan([stage, "eval"], rl_iterations=1, resume=True, overwrite=False).run == ["eval"]
        rd.plan([stage], rl_iterations=1, resume=False, overwrite=True)
        assert not (tmp_path / "policy" / stage).exists()


def test_noisy_expert_mixes_random_actions_at_the_noise_rate():
    from arborl.train.midtrain import noisy_expert

    class Lake(FrozenLake):
        def expert_action(self) -> str:
            return "EXPERT"

    class ToolLike(Lake):
        actions = ()

        def random_action(self, rng: random.Random) -> str:
            return f"search[{rng.choice(['a', 'b'])}]"

    env = Lake(size=4)
    env.reset(seed=0)
    act = noisy_expert(0.3, random.Random(0))
    picks = [act(env) for _ in range(4000)]
    share = sum(p != "EXPERT" for p in picks) / len(picks)
    assert share == pytest.approx(0.3, abs=0.03)  # "EXPERT" is no legal action, so every random pick differs
    assert set(picks) - {"EXPERT"} <= {str(a) for a in env.actions}
    assert noisy_expert(0.0, random.Random(0))(env) == "EXPERT"
    tool = ToolLike(size=4)
    noisy = noisy_expert(1.0, random.Random(0))
    assert {noisy(tool) for _ in range(50)} == {"search[a]", "search[b]"}  # the env's own random call wins

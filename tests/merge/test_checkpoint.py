"""Merging real checkpoints: exactness, refusals that name the difference, the CLI, portability."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from arborl.config import ConfigError
from arborl.merge import MergeConfig, methods
from arborl.merge.checkpoint import CHUNK_ELEMENTS, merge_checkpoints
from arborl.policy import ModelConfig, build_model, load_policy, save_policy, train_tokenizer
from tests.e2e.clikit import arborl

SMALL = ModelConfig(hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=2, num_layers=2)
WORDS = ["a frozen lake map F H G P", "<answer>left</answer> <answer>right</answer>"]


def make(path: Path, seed: int, *, cfg: ModelConfig = SMALL, words: list[str] = WORDS) -> Path:
    tok = train_tokenizer(words)
    return save_policy(build_model(cfg, tok, seed=seed), tok, path)


@pytest.fixture
def two(tmp_path: Path) -> tuple[Path, Path]:
    return make(tmp_path / "a", 0), make(tmp_path / "b", 1)


def copy_of(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def test_linear_one_zero_is_the_first_checkpoint_exactly(two, tmp_path):
    a, b = two
    out = merge_checkpoints(MergeConfig(method="linear", models=[str(a), str(b)], weights=[1.0, 0.0]), tmp_path / "m")
    wa, wm = weights(a), weights(out)
    assert wa.keys() == wm.keys()
    assert all(torch.equal(wa[k], wm[k]) for k in wa)
    model, tok = load_policy(out)  # a checkpoint arborl (and plain transformers) reads, with the tokenizer
    ref, ref_tok = load_policy(a)
    ids = torch.tensor([ref_tok.encode("a frozen lake")])
    assert torch.equal(model(ids).logits, ref(ids).logits)
    assert tok.get_vocab() == ref_tok.get_vocab() and tok.chat_template == ref_tok.chat_template
    AutoModelForCausalLM.from_pretrained(out)


def test_average_of_two_checkpoints_is_the_mean_of_every_tensor(two, tmp_path):
    a, b = two
    out = merge_checkpoints(MergeConfig(method="linear", models=[str(a), str(b)]), tmp_path / "m")
    wa, wb, wm = weights(a), weights(b), weights(out)
    for k in wa:
        torch.testing.assert_close(wm[k], (wa[k] + wb[k]) / 2)


def test_ties_onto_itself_is_the_base(two, tmp_path):
    a, b = two
    out = merge_checkpoints(MergeConfig(method="ties", models=[str(a), str(a)], base=str(a), density=0.5),
                            tmp_path / "m")
    assert all(torch.equal(v, weights(out)[k]) for k, v in weights(a).items())


def test_different_sizes_name_the_first_mismatching_tensor(two, tmp_path):
    a, _ = two
    wide = make(tmp_path / "wide", 0, cfg=ModelConfig(hidden_size=48, intermediate_size=64, num_heads=2, num_kv_heads=2,
                                                       num_layers=2))
    with pytest.raises(ConfigError, match=r"tensor model\.embed_tokens\.weight is shape \[\d+, 48\], not shape \[\d+, 32\]"):
        merge_checkpoints(MergeConfig(models=[str(a), str(wide)]), tmp_path / "m")


def test_one_reshaped_tensor_is_named(two, tmp_path):
    a, b = two
    bad = copy_of(b, tmp_path / "bad")
    w = weights(bad)
    name = "model.layers.1.mlp.up_proj.weight"
    w[name] = w[name][:-1].clone()
    save_file(w, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=rf"tensor {name} is shape \[63, 32\], not shape \[64, 32\]"):
        merge_checkpoints(MergeConfig(models=[str(a), str(bad)]), tmp_path / "m")
    del w[name]
    save_file(w, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=rf"tensor {name} is missing"):
        merge_checkpoints(MergeConfig(models=[str(a), str(bad)]), tmp_path / "m")


def test_other_architecture_config_is_named(two, tmp_path):
    a, b = two
    other = copy_of(b, tmp_path / "other")
    text = (other / "config.json").read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05')
    assert "1e-05" in text
    (other / "config.json").write_text(text)
    with pytest.raises(ConfigError, match="config.json rms_norm_eps is 1e-05, not 1e-06"):
        merge_checkpoints(MergeConfig(models=[str(a), str(other)]), tmp_path / "m")


def test_other_tokenizer_of_the_same_size_is_refused(two, tmp_path):
    a, _ = two
    words = [w.replace("lake", "pond") for w in WORDS]  # same vocabulary size, another word
    other = make(tmp_path / "pond", 1, words=words)
    assert weights(other)["model.embed_tokens.weight"].shape == weights(a)["model.embed_tokens.weight"].shape
    with pytest.raises(ConfigError, match="tokenizer file tokenizer.json differs"):
        merge_checkpoints(MergeConfig(models=[str(a), str(other)]), tmp_path / "m")


def test_method_options_are_checked():
    with pytest.raises(ConfigError, match="set merge.base"):
        MergeConfig(method="ties", models=["x", "y"])
    with pytest.raises(ConfigError, match="exactly two"):
        MergeConfig(method="slerp", models=["x", "y", "z"])
    with pytest.raises(ConfigError, match="one per model"):
        MergeConfig(models=["x", "y"], weights=[1.0])


def test_cli_ties_merge_and_its_errors(two, tmp_path):
    a, b = two
    base = make(tmp_path / "base", 2)
    p = arborl("merge", "--method", "ties", "--out", str(tmp_path / "m"), str(a), str(b), "--base", str(base),
               "--density", "0.5", "--weights", "0.5,0.5")
    assert "merged 2 checkpoints (ties)" in p.stdout
    wm, wa, wb, wbase = weights(tmp_path / "m"), weights(a), weights(b), weights(base)
    k = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(wm[k], wbase[k]) and not torch.equal(wm[k], wa[k]) and not torch.equal(wm[k], wb[k])
    load_policy(tmp_path / "m")
    wide = make(tmp_path / "wide", 0, cfg=ModelConfig(hidden_size=48, intermediate_size=64, num_heads=2,
                                                       num_kv_heads=2, num_layers=2))
    bad = arborl("merge", "--out", str(tmp_path / "m2"), str(a), str(wide), check=False)
    assert bad.returncode == 2
    assert bad.stderr.startswith("arborl: error: merge:") and "model.embed_tokens.weight" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    missing = arborl("merge", "--method", "dare", "--out", str(tmp_path / "m3"), str(a), str(b), check=False)
    assert missing.returncode == 2 and "set merge.base (--base)" in missing.stderr


def test_a_reloaded_checkpoint_keeps_its_tokenizer(two, tmp_path):
    # load_policy + save_policy (what every training stage does) adds loading flags to
    # tokenizer_config.json; the tokenizer is the same, so the merge must not refuse it
    a, _ = two
    model, tok = load_policy(a)
    again = save_policy(model, tok, tmp_path / "again")
    assert (again / "tokenizer_config.json").read_text() != (a / "tokenizer_config.json").read_text()
    merge_checkpoints(MergeConfig(method="ties", models=[str(again), str(a)], base=str(a)), tmp_path / "m")


def large_checkpoints(tmp_path: Path) -> tuple[list[torch.Tensor], list[str]]:
    """Four checkpoints with a tensor above CHUNK_ELEMENTS (merged in row slices) and a small one."""
    gen = torch.Generator().manual_seed(0)
    shape = (700, 1000)
    assert shape[0] * shape[1] > CHUNK_ELEMENTS
    values = [torch.randn(shape, generator=gen) for _ in range(4)]
    dirs = []
    for i, v in enumerate(values):
        d = tmp_path / f"m{i}"
        d.mkdir()
        save_file({"w": v, "small": v[:3, :3].clone()}, str(d / "model.safetensors"), metadata={"format": "pt"})
        (d / "config.json").write_text('{"model_type": "llama"}')
        dirs.append(str(d))
    return values, dirs


def test_ties_in_row_slices_equals_ties_on_the_whole_tensor(tmp_path):
    values, dirs = large_checkpoints(tmp_path)
    cfg = MergeConfig(method="ties", models=dirs[1:], base=dirs[0], weights=[1.0, 0.5, 2.0], density=0.3, scale=0.8)
    out = weights(merge_checkpoints(cfg, tmp_path / "out"))
    whole = methods.ties(lambda i: values[i + 1].clone(), lambda _: values[0].clone(), [1.0, 0.5, 2.0], density=0.3,
                         scale=0.8)
    assert torch.equal(out["w"], whole)


def test_sliced_linear_is_the_average_and_sliced_dare_is_reproducible(tmp_path):
    values, dirs = large_checkpoints(tmp_path)
    out = weights(merge_checkpoints(MergeConfig(models=dirs[1:]), tmp_path / "avg"))
    torch.testing.assert_close(out["w"], (values[1] + values[2] + values[3]) / 3)

    def dare(seed: int, where: str) -> torch.Tensor:
        cfg = MergeConfig(method="dare", models=dirs[1:3], base=dirs[0], density=0.5, seed=seed)
        return weights(merge_checkpoints(cfg, tmp_path / where))["w"]

    first, again, other = dare(0, "d0"), dare(0, "d0b"), dare(1, "d1")
    assert torch.equal(first, again) and not torch.equal(first, other)
    # every entry is base + sum of kept task-vector entries / density, each kept or dropped
    taus = [(values[i] - values[0]) / 2 for i in (1, 2)]  # weights 1/2 each
    options = [values[0] + a * taus[0] / 0.5 + b * taus[1] / 0.5 for a in (0, 1) for b in (0, 1)]
    close = torch.stack([(first - o).abs() < 1e-4 for o in options]).any(0)
    assert close.all()
    kept_both = ((first - options[3]).abs() < 1e-4).float().mean().item()
    assert 0.2 < kept_both < 0.3  # both kept with probability 0.25, in every slice alike

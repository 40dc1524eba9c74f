"""What a user meets first: --help and --version at once, discoverable config, one-line errors, eval of any checkpoint."""

import json
import subprocess
import sys
import time
import tomllib

import pytest
from clikit import ROOT, arborl, cli_env, sets

from arborl.config import build, config_keys, load_config
from arborl.train.config import TrainConfig

CFG = "examples/frozenlake.toml"


def test_help_imports_no_torch_and_answers_fast():
    cmd = [sys.executable, "-X", "importtime", "-m", "arborl.cli", "--help"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=cli_env(), cwd=ROOT, timeout=60)
    wall = time.perf_counter() - t0
    assert p.returncode == 0 and "train" in p.stdout and "config" in p.stdout and "store" in p.stdout
    imported = {line.split("|")[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "arborl.store.cli" in imported  # the whole parser was built (store commands included)
    heavy = sorted(m for m in imported if m.split(".")[0] in ("torch", "transformers", "numpy", "tokenizers"))
    assert heavy == [], heavy
    assert wall < 3.0, wall  # ~0.4 s on an idle 2-core machine; the bound leaves room for a loaded one


def test_version():
    from arborl import __version__

    p = arborl("--version")
    assert p.stdout.strip() == f"arborl {__version__}"


def test_config_keys_lists_every_key_with_type_default_and_help():
    p = arborl("config", "keys")
    lines = p.stdout.splitlines()
    keys = config_keys(TrainConfig)
    assert [line.split()[0] for line in lines] == [k.key for k in keys]
    lr = next(line for line in lines if line.startswith("rl.lr "))
    assert lr.startswith("rl.lr  (float, default 0.0003)  Peak learning rate")


def test_config_show_prints_the_resolved_config_as_toml_with_defaults_and_help():
    p = arborl("config", "show", CFG, "--set", "rl.lr=1e-4", "--set", "env.kwargs.size=5")
    out = p.stdout
    assert "[rl]\n" in out and "lr = 0.0001  # default: 0.0003\n" in out
    assert "# Peak learning rate of AdamW" in out
    assert "credit = \"best_step\"  # default: \"gigpo\"\n" in out  # from the file
    assert "ppo_epochs = 2\n" in out  # equal to the default: no note
    # the printed text is a config: it loads back to the same tree
    cfg = load_config(TrainConfig, CFG, ["rl.lr=1e-4", "env.kwargs.size=5"])
    assert build(TrainConfig, tomllib.loads(out)) == cfg


@pytest.mark.parametrize("args,needle", [
    (["--set", 'env.cls="collections:OrderedDict"'],
     "env.cls = 'collections:OrderedDict' is not an env: OrderedDict has no reset, step, format_observation"),
    (["--set", 'env.cls="tests.e2e.broken_env:NoClose"'], "NoClose has no callable"),
    (["--set", 'store="mongodb://x/y"'], "store URL 'mongodb://x/y'"),
    (["--set", 'report_to=["comet"]'], "report_to: ['comet'] are unknown"),
    (["--set", "rl.branch=true", "--set", "rollout.sampling.temperature=0.5"],
     "rollout.sampling.temperature = 1 or rl.branch_greedy = false"),
])
def test_arborl_errors_are_one_line_and_exit_2(tmp_path, args, needle):
    p = arborl("train", CFG, "--set", f'run_dir="{tmp_path / "run"}"', *args, check=False)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("arborl: error: "), p.stderr
    assert needle in p.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("trained") / "run"
    arborl("train", CFG, *sets(run))
    return run, json.loads((run / "summary.json").read_text())


def test_eval_checkpoint_reproduces_the_runs_own_evaluation(trained, tmp_path):
    run, summary = trained
    p = arborl("eval", CFG, "--checkpoint", str(run / "policy" / "rl"), *sets(tmp_path / "ev"))
    assert "checkpoint" in p.stdout and " - " not in p.stdout
    got = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert got["checkpoint"] == summary["rl"]  # same held-out tasks, greedy: the same numbers
    assert f"{summary['rl']['turns']:.3f}" in p.stdout


def test_eval_policy_init_evaluates_that_model(trained, tmp_path):
    run, summary = trained
    p = arborl("eval", CFG, *sets(tmp_path / "ev", [f'policy.init="{run}/policy/sft"']))
    got = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert got["init"] == summary["sft"] and "initial policy" in p.stdout


def test_eval_with_nothing_to_evaluate_is_refused(tmp_path):
    p = arborl("eval", CFG, *sets(tmp_path / "ev"), check=False)
    assert p.returncode == 2 and "nothing to evaluate" in p.stderr and "--checkpoint PATH" in p.stderr
    assert not (tmp_path / "ev").exists()

"""One real tiny run with every logger on: documented metrics, W&B offline, MLflow file store, progress bars."""

import json
import re

import pytest
from clikit import arborl, cli_env, sets

from arborl.train.common import METRICS


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    # rl.max_staleness = 1: the asynchronous rollouts' metrics (staleness, behaviour weights) are logged too;
    # rl.kl_coef > 0 (the example has none): the KL term's metric too
    run = tmp_path_factory.mktemp("outputs") / "run"
    env = cli_env(ARBORL_PROGRESS="1", WANDB_MODE="offline", WANDB_PROJECT="arborl-test")
    p = arborl("train", "examples/frozenlake.toml", *sets(run, ['report_to=["tensorboard","wandb","mlflow"]',
                                                               "rl.max_staleness=1", "rl.kl_coef=0.05"]), env=env)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return run, rows, p.stdout


def test_every_logged_metric_is_documented_and_every_documented_one_is_logged(run):
    _, rows, _ = run
    logged = {k for r in rows for k in r}
    assert sorted(logged - set(METRICS)) == [], "add these to arborl/train/common.py:METRICS"
    assert sorted(set(METRICS) - logged) == [], "METRICS lists keys no run logs"


def test_wandb_offline_writes_its_run_folder(run):
    run_dir, rows, _ = run
    folders = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(folders) == 1
    data = next(folders[0].glob("run-*.wandb")).read_bytes()
    for key in ("rl/train/success", "rl/loss/policy", "sft/loss/sft", "sft/step"):
        assert key.encode() in data, key


def test_mlflow_file_store_holds_the_same_numbers_as_metrics_jsonl(run, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses its file store otherwise

    run_dir, rows, _ = run
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    (exp,) = [e for e in client.search_experiments() if e.name == "arborl"]
    (mrun,) = client.search_runs([exp.experiment_id])
    for stage, key in (("rl", "loss/policy"), ("sft", "loss/sft"), ("rl", "env_steps"), ("sft", "success")):
        history = sorted((m.step, m.value) for m in client.get_metric_history(mrun.info.run_id, f"{stage}/{key}"))
        want = [(r["step"], r[key]) for r in rows if r["stage"] == stage and key in r]
        assert [s for s, _ in history] == [s for s, _ in want] and len(want) >= 2, key
        assert [v for _, v in history] == pytest.approx([v for _, v in want]), key
    assert mrun.data.params["rl.iterations"] == "2"


def test_progress_bars_show_the_last_iterations_numbers(run):
    _, rows, out = run
    rl = [r for r in rows if r["stage"] == "rl"][-1]
    sft = [r for r in rows if r["stage"] == "sft"][-1]
    line = next(x for x in out.splitlines() if x.startswith("rl "))
    assert re.search(rf"loss {rl['loss/policy']:.3f}\s+success {rl['train/success']:.3f}\s+reward "
                     rf"{rl['train/reward']:.3f}", line), line
    line = next(x for x in out.splitlines() if x.startswith("sft "))
    assert f"loss {sft['loss/sft']:.3f}" in line and f"success {sft['success']:.3f}" in line, line
    line = next(x for x in out.splitlines() if x.startswith("synth "))
    assert re.search(r"episodes 60\s+success 1\.000\s+reward \d\.\d{3}", line), line

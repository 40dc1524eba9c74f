"""One run per run_dir: reruns are refused, --overwrite replaces, --resume continues, Ctrl-C stops cleanly."""

import json
import subprocess
import sys
import time

import pytest
import torch
from clikit import arborl, cli_env, ctrl_c, sets, start
from safetensors.torch import load_file

CFG = "examples/frozenlake.toml"


def rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def steps(run, stage):
    return [r["step"] for r in rows(run) if r["stage"] == stage]


@pytest.mark.slow
def test_rerun_is_refused_and_overwrite_replaces_the_old_run(tmp_path):
    run = tmp_path / "run"
    extra = ['stages=["synth","sft","rl"]', "rl.iterations=3"]
    arborl("train", CFG, *sets(run, extra))
    before = (run / "metrics.jsonl").read_text()
    # checkpoint_every=1 wrote rl-1, rl-2, rl-3; rl.checkpoint_keep (default 2) keeps the newest two
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["rl-000002", "rl-000003"]

    again = arborl("train", CFG, *sets(run, extra), check=False)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"arborl: error: run_dir '{run}' already holds rl, sft, synth output of an earlier run; pass --resume to "
        "continue it, --overwrite to replace it, or set another run_dir"]
    assert (run / "metrics.jsonl").read_text() == before  # nothing was touched

    arborl("train", CFG, "--overwrite", *sets(run, [*extra, "rl.checkpoint_keep=1"]))
    assert steps(run, "sft") == [1, 2, 3, 4, 5, 6] and steps(run, "rl") == [1, 2, 3]  # one run's rows, not two
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["rl-000003"]
    from arborl.store import open_store

    with open_store(f"sqlite:///{run}/trajectories.db") as store:  # the old run's episodes went with it
        assert store.count(source="synth") == 60


@pytest.mark.slow
def test_stage_commands_share_a_run_dir_but_do_not_repeat_a_stage(tmp_path):
    run = tmp_path / "run"
    arborl("synth", CFG, *sets(run))
    arborl("sft", CFG, *sets(run))
    p = arborl("sft", CFG, *sets(run), check=False)
    assert p.returncode == 2 and "already holds sft output" in p.stderr
    assert steps(run, "sft") == [1, 2, 3, 4, 5, 6]


def test_resume_with_nothing_to_resume_is_refused_and_writes_nothing(tmp_path):
    run = tmp_path / "fresh"
    p = arborl("train", CFG, "--resume", *sets(run), check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "holds no synth/sft/rl output to resume" in p.stderr and "run without --resume" in p.stderr
    assert not run.exists()


def _wait_for_rl_rows(run, proc, n, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early:\n{proc.communicate()}")
        if (run / "metrics.jsonl").exists() and len(steps(run, "rl")) >= n:
            return
        time.sleep(0.2)
    raise AssertionError("no RL iteration in time")


@pytest.mark.slow
def test_ctrl_c_stops_at_an_iteration_and_resume_continues_exactly(tmp_path):
    run, straight = tmp_path / "stopped", tmp_path / "straight"
    # constant lr: the schedule then does not depend on rl.iterations, which the resume lowers
    base = ['stages=["synth","sft","rl"]', "rl.eval_every=0", "rl.checkpoint_every=1000", "rl.warmup_iters=0",
            'rl.lr_schedule="constant"']
    proc = start("train", CFG, *sets(run, [*base, "rl.iterations=500"]))
    _wait_for_rl_rows(run, proc, 2)
    out, err = ctrl_c(proc, timeout=120)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    n = len(steps(run, "rl"))
    assert f"arborl: stopped at iteration {n}; continue with --resume" in err
    ckpts = [p.name for p in (run / "checkpoints").iterdir()]
    assert ckpts == [f"rl-{n:06d}"]  # the interrupted iteration was finished and checkpointed

    p = arborl("train", CFG, "--resume", *sets(run, [*base, f"rl.iterations={n + 2}"]))
    assert "resume: synth finished earlier; skipped" in p.stdout and "resume: sft finished earlier; skipped" in p.stdout
    assert f"resume: rl continues from checkpoint {run}/checkpoints/rl-{n:06d} (iteration {n})" in p.stdout
    assert steps(run, "sft") == [1, 2, 3, 4, 5, 6]  # SFT did not run again
    assert steps(run, "rl") == list(range(1, n + 3))  # every iteration once
    from arborl.store import open_store

    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        assert store.count(source="synth") == 60  # synth did not run again

    arborl("train", CFG, *sets(straight, [*base, f"rl.iterations={n + 2}"]))
    a = load_file(straight / "policy" / "rl" / "model.safetensors")
    b = load_file(run / "policy" / "rl" / "model.safetensors")
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_ctrl_c_in_sft_keeps_synth_and_resume_redoes_only_sft(tmp_path):
    run = tmp_path / "run"
    proc = start("train", CFG, *sets(run, ['stages=["synth","sft"]', "sft.steps=100000", "sft.eval_every=0"]))
    t0 = time.time()
    while not ((run / "metrics.jsonl").exists() and steps(run, "sft")):
        assert proc.poll() is None and time.time() - t0 < 120, proc.communicate()
        time.sleep(0.2)
    out, err = ctrl_c(proc, timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    # the first Ctrl-C is taken between two steps: the stage stops there, not inside a library call
    assert "arborl: Ctrl-C: stopping after this step (Ctrl-C again to stop at once)" in err
    assert err.strip().splitlines()[-1] == ("arborl: stopped during sft; continue with --resume "
                                            "(sft starts again; finished stages are kept)")
    p = arborl("train", CFG, "--resume", *sets(run, ['stages=["synth","sft"]', "sft.eval_every=0"]))
    assert "resume: synth finished earlier; skipped" in p.stdout
    assert steps(run, "sft") == [1, 2, 3, 4, 5, 6]  # the interrupted stage's rows were replaced, not appended to
    from arborl.store import open_store

    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        assert store.count(source="synth") == 60


def test_a_run_dir_in_use_by_another_process_is_refused_and_left_alone(tmp_path):
    import os

    from arborl.train.rundir import LOCK_FILE, RunDir

    run = tmp_path / "busy"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    with RunDir(run, default_store=True).hold():
        assert (run / LOCK_FILE).read_text().strip() == str(os.getpid())
        p = arborl("train", CFG, "--resume", *sets(run), check=False)
        assert p.returncode == 2 and "Traceback" not in p.stderr
        assert p.stderr.strip().splitlines() == [
            f"arborl: error: run_dir {run} is in use by another arborl process (pid {os.getpid()}); "
            "wait for it to finish or stop it, or choose another run_dir"]
        assert sorted(q.name for q in run.iterdir()) == [LOCK_FILE, "metrics.jsonl"]  # nothing written
    with RunDir(run, default_store=True).hold():  # released on exit: the next command may run
        pass


def test_the_run_dir_lock_goes_with_a_killed_process(tmp_path):
    from arborl.config import ConfigError
    from arborl.train.rundir import RunDir

    run = tmp_path / "run"
    code = ("import sys, time; from arborl.train.rundir import RunDir\n"
            f"with RunDir({str(run)!r}, default_store=True).hold():\n"
            "    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=cli_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"pid {holder.pid}\)"), RunDir(run, default_store=True).hold():
            pass
    finally:
        holder.kill()
        holder.wait()
    with RunDir(run, default_store=True).hold():  # no stale lock after SIGKILL
        pass
    assert run.is_dir()  # the directory existed before this hold, so it stays

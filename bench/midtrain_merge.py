"""Mid-training and merging on the CPU recipes, through the real CLI, on small budgets.

``merge``: one shared initial policy (a tokenizer trained on FrozenLake and Sokoban text, so both
specialists share ids and architecture), an SFT specialist per env from it, then merges of the
two (linear 0.5/0.5, task arithmetic with weights 1/1 and TIES at density 0.5 onto the shared
init); every source and merge is evaluated greedily on both envs' held-out tasks. Prints each
merge's score on each env as a fraction of that env's specialist.

``midtrain``: FrozenLake, ``synth -> sft`` against ``synth -> midtrain -> sft`` at equal forward
tokens (the mid-training steps replace SFT steps of the same token count), each seed's held-out
success after each stage.

``rl`` (after ``midtrain``, same ``--out``): RL with the same budget on top of both arms.

Usage: ``python bench/midtrain_merge.py merge|midtrain|rl --out DIR [--seeds 0,1] [--eval 128]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENVS = {"frozenlake": "examples/frozenlake.toml", "sokoban": "examples/sokoban.toml"}
SMALL = ["policy.model.hidden_size=128", "policy.model.intermediate_size=344", "threads=1", "report_to=[]",
         "sft.eval_every=0"]


def cli(*args: str) -> None:
    """Run ``arborl ARGS``; raise with its output if it fails."""
    p = subprocess.run([sys.executable, "-m", "arborl.cli", *args], capture_output=True, text=True, cwd=ROOT)
    if p.returncode:
        raise SystemExit(f"arborl {' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")


def sets(pairs: list[str]) -> list[str]:
    return [a for kv in pairs for a in ("--set", kv)]


def shared_init(out: Path) -> Path:
    """A scratch policy whose tokenizer knows both envs' words."""
    from arborl.config import load_config
    from arborl.policy import build_model, save_policy, train_tokenizer
    from arborl.train.common import env_factory
    from arborl.train.config import TrainConfig
    from arborl.train.stages import _corpus

    texts, words = [], []
    for config in ENVS.values():
        cfg = load_config(TrainConfig, ROOT / config, SMALL)
        t, w = _corpus(env_factory(cfg.env), 300, cfg.env.train_seed_start, cfg.seed)
        texts += t
        words += w
    tok = train_tokenizer(texts + words, extra_words=words)
    return save_policy(build_model(cfg.policy.model, tok, seed=0), tok, out)


def evaluate(env: str, checkpoint: Path, run: Path, episodes: int) -> float:
    cli("eval", ENVS[env], "--checkpoint", str(checkpoint), *sets([f'run_dir="{run}"', f"eval.episodes={episodes}",
                                                                    *SMALL]))
    return json.loads((run / "summary.json").read_text())["checkpoint"]["success"]


def bench_merge(out: Path, episodes: int) -> dict:
    init = out / "init" if (out / "init" / "config.json").exists() else shared_init(out / "init")
    specialists = {}
    for env, config in ENVS.items():
        run = out / f"sft-{env}"
        if not (run / "policy" / "sft" / "config.json").exists():  # a rerun reuses finished specialists
                cli("train", config, *sets([f'run_dir="{run}"', f'policy.init="{init}"', 'stages=["synth", "sft"]',
                                        "synth.episodes=600", "sft.steps=80", *SMALL]))
        specialists[env] = run / "policy" / "sft"
    a, b = (str(specialists[e]) for e in ENVS)
    merges = {"linear": ["--method", "linear"], "task_arithmetic": ["--method", "task_arithmetic", "--base", str(init),
                                                                    "--weights", "1,1"],
              "ties": ["--method", "ties", "--base", str(init), "--weights", "1,1", "--density", "0.5"]}
    paths = {**{f"sft-{e}": p for e, p in specialists.items()}}
    for name, args in merges.items():
        cli("merge", *args, "--out", str(out / name), a, b)
        paths[name] = out / name
    scores = {name: {env: evaluate(env, p, out / f"eval-{name}-{env}", episodes) for env in ENVS}
              for name, p in paths.items()}
    kept = {name: {env: s[env] / max(scores[f"sft-{env}"][env], 1e-9) for env in ENVS}
            for name, s in scores.items() if name in merges}
    return {"success": scores, "kept_of_specialist": kept}


def bench_midtrain(out: Path, seeds: list[int], episodes: int, sft_steps: int, replaced: int) -> dict:
    from arborl.store import open_store
    from arborl.trajectory import linearize

    rows: dict = {}
    for seed in seeds:
        base = [f"seed={seed}", "synth.episodes=600", f"eval.episodes={episodes}", *SMALL]
        a = out / f"sft-only-{seed}"
        cli("train", ENVS["frozenlake"], *sets([f'run_dir="{a}"', 'stages=["synth", "sft", "eval"]',
                                                 f"sft.steps={sft_steps}", *base]))
        with open_store(f"sqlite:///{a}/trajectories.db") as store:
            lengths = [len(linearize(e).input_ids) for e in store.iter_episodes(source="synth")]
        per_sft_step = 32 * sum(lengths) / len(lengths)  # forward tokens of one SFT step (no padding counted)
        rows_per_step, seq_len = 4, 512
        mid_steps = max(1, round(replaced * per_sft_step / (rows_per_step * seq_len)))
        b = out / f"midtrain-{seed}"
        cli("train", ENVS["frozenlake"], *sets([f'run_dir="{b}"', 'stages=["synth", "midtrain", "sft", "eval"]',
                                                 f"sft.steps={sft_steps - replaced}", f"midtrain.steps={mid_steps}",
                                                 f"midtrain.seq_len={seq_len}", f"midtrain.batch_size={rows_per_step}",
                                                 "midtrain.synth_episodes=1200", "midtrain.warmup_steps=5", *base]))
        sa, sb = (json.loads((r / "summary.json").read_text()) for r in (a, b))
        rows[seed] = {"sft_only": {"sft": sa["sft"]["success"], "sft_tokens": round(sft_steps * per_sft_step)},
                      "midtrain_sft": {"midtrain": sb["midtrain"]["success"], "sft": sb["sft"]["success"],
                                       "midtrain_steps": mid_steps, "sft_steps": sft_steps - replaced,
                                       "tokens": round((sft_steps - replaced) * per_sft_step + sb["midtrain_tokens"])}}
    return rows


def bench_rl(out: Path, seeds: list[int], episodes: int, iterations: int) -> dict:
    """RL on top of both arms of ``midtrain`` (run first), the same RL budget for each."""
    rows: dict = {}
    for seed in seeds:
        for arm in ("sft-only", "midtrain"):
            run = out / f"{arm}-{seed}"
            cli("train", ENVS["frozenlake"], *sets([
                f'run_dir="{run}"', 'stages=["rl", "eval"]', f"seed={seed}", f"eval.episodes={episodes}",
                f"rl.iterations={iterations}", "rl.tasks_per_iter=8", "rl.eval_every=0", "rl.checkpoint_every=0",
                "synth.episodes=600", *SMALL]))
            s = json.loads((run / "summary.json").read_text())
            rows.setdefault(seed, {})[arm] = {k: s[k]["success"] for k in ("midtrain", "sft", "rl") if k in s}
            rows[seed][arm]["rl_tokens"] = s["tokens"]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["merge", "midtrain", "rl"])
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--eval", type=int, default=128, help="held-out episodes per evaluation")
    p.add_argument("--sft-steps", type=int, default=60)
    p.add_argument("--replaced", type=int, default=20, help="SFT steps whose tokens mid-training gets instead")
    p.add_argument("--rl-iterations", type=int, default=15, help="rl: RL iterations on top of each midtrain arm")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.what == "merge":
        result = bench_merge(out, args.eval)
    elif args.what == "rl":
        result = bench_rl(out, [int(s) for s in args.seeds.split(",")], args.eval, args.rl_iterations)
    else:
        result = bench_midtrain(out, [int(s) for s in args.seeds.split(",")], args.eval, args.sft_steps, args.replaced)
    (out / f"{args.what}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

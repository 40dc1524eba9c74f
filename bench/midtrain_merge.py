"""Mid-training and merging on the CPU recipes, through the real CLI, on small budgets.

``merge``: one shared initial policy (a tokenizer trained on FrozenLake and Sokoban text, so both
specialists share ids and architecture), an SFT specialist per env from it, then merges of the
two (linear 0.5/0.5, task arithmetic with weights 1/1 and TIES at density 0.5 onto the shared
init); every source and merge is evaluated greedily on both envs' held-out tasks. Prints each
merge's score on each env as a fraction of that env's specialist.

``midtrain``: a recipe (``--recipe frozenlake``, or a tool recipe: ``code``, ``search``, ``finqa``),
``synth -> sft`` against ``synth -> midtrain -> sft`` at equal forward tokens (the mid-training
steps replace SFT steps of the same token count), each seed's held-out success after each stage.

``rl`` (after ``midtrain``, same ``--out``): RL with the same budget on top of both arms.

``toolmerge``: the two tool recipes (Search-R1 and FinQA) on one base. A byte-level BPE tokenizer
trained on both tasks' text; each recipe's teacher demonstrations rendered with it; one joint SFT
on both sets (the common base); an RL specialist per task from that base (each recipe's own RL
stage); then merges of the two RL models (linear 0.5/0.5, task arithmetic and TIES onto the base,
DARE); the base, both specialists and every merge evaluated greedily on both tasks' held-out
questions. Prints what each merge keeps of each specialist's score on its own task.

Usage: ``python bench/midtrain_merge.py merge|midtrain|rl|toolmerge --out DIR [--recipe frozenlake|code|search|finqa] [--seeds 0,1] [--eval 128]``
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
TOOLS = {"search": "examples/search_r1.toml", "finqa": "examples/finqa.toml"}
TOOL_SET = ["threads=1", "report_to=[]", "sft.eval_every=0"]  # the tool recipes as they are, one thread, quiet
RECIPES = {  # midtrain / rl modes: the config, settings of every stage, settings of the RL stage
    "frozenlake": (ENVS["frozenlake"], ["synth.episodes=600", *SMALL], ["rl.tasks_per_iter=8"]),
    "code": ("examples/code_agent.toml", TOOL_SET, []),
    "search": (TOOLS["search"], TOOL_SET, []),
    "finqa": (TOOLS["finqa"], TOOL_SET, []),
}


def cli(*args: str) -> None:
    """Run ``arborl ARGS``; raise with its output if it fails."""
    cli_parallel([list(args)])


def cli_parallel(calls: list[list[str]]) -> None:
    """Run several ``arborl`` commands at once (one process each); raise if any fails."""
    procs = [(a, subprocess.Popen([sys.executable, "-m", "arborl.cli", *a], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, cwd=ROOT)) for a in calls]
    for args, p in procs:
        out, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"arborl {' '.join(args)} failed:\n{out[-4000:]}")


def sets(pairs: list[str]) -> list[str]:
    return [a for kv in pairs for a in ("--set", kv)]


def shared_init(out: Path, configs: list[str], settings: list[str], *, episodes: int | None = None,
                kind: str = "word", vocab_size: int = 2000) -> Path:
    """A scratch policy whose tokenizer knows every config's env text (so specialists share ids and shape).

    ``episodes``: corpus episodes per env (``None``: each config's ``policy.tokenizer_episodes``).
    """
    from arborl.config import load_config
    from arborl.policy import build_model, save_policy, train_tokenizer
    from arborl.train.common import env_factory
    from arborl.train.config import TrainConfig
    from arborl.train.stages import _corpus

    texts, words, shapes = [], [], set()
    for config in configs:
        cfg = load_config(TrainConfig, ROOT / config, settings)
        n = cfg.policy.tokenizer_episodes if episodes is None else episodes
        t, w = _corpus(env_factory(cfg.env), n, cfg.env.train_seed_start, cfg.seed)
        texts += t
        words += w
        shapes.add(repr(cfg.policy.model))
    if len(shapes) != 1:
        raise SystemExit(f"the configs' policy.model differ, so their models cannot be merged: {shapes}")
    tok = train_tokenizer(texts + words, extra_words=words, kind=kind, vocab_size=vocab_size)
    return save_policy(build_model(cfg.policy.model, tok, seed=0), tok, out)


def evaluate(env: str, checkpoint: Path, run: Path, episodes: int) -> float:
    cli("eval", ENVS[env], "--checkpoint", str(checkpoint), *sets([f'run_dir="{run}"', f"eval.episodes={episodes}",
                                                                    *SMALL]))
    return json.loads((run / "summary.json").read_text())["checkpoint"]["success"]


def bench_merge(out: Path, episodes: int) -> dict:
    init = out / "init" if (out / "init" / "config.json").exists() else shared_init(out / "init", [*ENVS.values()],
                                                                                       SMALL, episodes=300)
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


def bench_midtrain(out: Path, seeds: list[int], episodes: int, sft_steps: int, replaced: int,
                   recipe: str = "frozenlake", mid_synth: int = 1200, control: bool = False) -> dict:
    """Arm A (``sft-only``) against arm B (``midtrain``), and with ``control`` arm C (``sft-short``):
    SFT alone with B's SFT steps, which separates what mid-training adds from what B's shorter SFT
    schedule does. An arm whose run already holds its SFT evaluation is read back, not rerun."""
    from arborl.config import load_config
    from arborl.store import open_store
    from arborl.train.config import TrainConfig
    from arborl.trajectory import linearize

    config, settings, _ = RECIPES[recipe]
    batch = load_config(TrainConfig, ROOT / config, settings).sft.batch_size
    rows: dict = {}
    for seed in seeds:
        base = [f"seed={seed}", f"eval.episodes={episodes}", *settings]
        a = out / f"sft-only-{seed}"
        if not _has_sft_eval(a):
            cli("train", config, *sets([f'run_dir="{a}"', 'stages=["synth", "sft", "eval"]',
                                        f"sft.steps={sft_steps}", *base]))
        with open_store(f"sqlite:///{a}/trajectories.db") as store:
            lengths = [len(linearize(e).input_ids) for e in store.iter_episodes(source="synth")]
        per_sft_step = batch * sum(lengths) / len(lengths)  # forward tokens of one SFT step (no padding counted)
        rows_per_step, seq_len = 4, 512
        mid_steps = max(1, round(replaced * per_sft_step / (rows_per_step * seq_len)))
        b = out / f"midtrain-{seed}"
        if not _has_sft_eval(b):
            cli("train", config, *sets([f'run_dir="{b}"', 'stages=["synth", "midtrain", "sft", "eval"]',
                                        f"sft.steps={sft_steps - replaced}", f"midtrain.steps={mid_steps}",
                                        f"midtrain.seq_len={seq_len}", f"midtrain.batch_size={rows_per_step}",
                                        f"midtrain.synth_episodes={mid_synth}", "midtrain.warmup_steps=5", *base]))
        sa, sb = (json.loads((r / "summary.json").read_text()) for r in (a, b))
        rows[seed] = {"sft_only": {"sft": sa["sft"]["success"], "sft_tokens": round(sft_steps * per_sft_step)},
                      "midtrain_sft": {"midtrain": sb["midtrain"]["success"], "sft": sb["sft"]["success"],
                                       "midtrain_steps": mid_steps, "sft_steps": sft_steps - replaced,
                                       "tokens": round((sft_steps - replaced) * per_sft_step + sb["midtrain_tokens"])}}
        if control:
            c = out / f"sft-short-{seed}"
            if not _has_sft_eval(c):
                cli("train", config, *sets([f'run_dir="{c}"', 'stages=["synth", "sft", "eval"]',
                                            f"sft.steps={sft_steps - replaced}", *base]))
            rows[seed]["sft_short"] = {"sft": json.loads((c / "summary.json").read_text())["sft"]["success"],
                                       "sft_steps": sft_steps - replaced}
    return rows


def _has_sft_eval(run: Path) -> bool:
    """Whether ``run`` finished an ``eval`` of its SFT policy (so a rerun of the bench reads it back)."""
    summary = run / "summary.json"
    return summary.exists() and "sft" in json.loads(summary.read_text())


def bench_rl(out: Path, seeds: list[int], episodes: int, iterations: int, recipe: str = "frozenlake") -> dict:
    """RL on top of each arm of ``midtrain`` (run first; its control arm too when it ran), the same RL budget for each.

    An arm whose run already holds its RL evaluation is read back, not rerun.
    """
    config, settings, rl = RECIPES[recipe]
    rows: dict = {}
    for seed in seeds:
        for arm in ("sft-only", "midtrain", "sft-short"):
            run = out / f"{arm}-{seed}"
            summary = run / "summary.json"
            if not summary.exists():
                continue  # the control arm was not run
            if "rl" not in json.loads(summary.read_text()):
                cli("train", config, *sets([
                    f'run_dir="{run}"', 'stages=["rl", "eval"]', f"seed={seed}", f"eval.episodes={episodes}",
                    f"rl.iterations={iterations}", *rl, "rl.eval_every=0", "rl.checkpoint_every=0", *settings]))
            s = json.loads(summary.read_text())
            rows.setdefault(seed, {})[arm] = {k: s[k]["success"] for k in ("midtrain", "sft", "rl") if k in s}
            rows[seed][arm]["rl_tokens"] = s["tokens"]
    return rows


def bench_toolmerge(out: Path, sft_steps: int, synth_each: int, extra: list[str]) -> dict:
    """``extra``: settings appended to every command (e.g. a smaller eval.episodes or rl.iterations)."""
    from arborl.store import open_store

    init = out / "init"
    if not (init / "config.json").exists():  # a BPE over both tasks' text, as the search recipe's own tokenizer
        shared_init(init, [*TOOLS.values()], TOOL_SET, kind="bpe", vocab_size=3000)
    tool_set = [*TOOL_SET, *extra]
    common = [f'policy.init="{init}"', *tool_set]
    synth = {t: out / f"synth-{t}" for t in TOOLS}
    cli_parallel([["train", TOOLS[t], *sets([f'run_dir="{synth[t]}"', 'stages=["synth"]',
                                            f"synth.episodes={synth_each}", *common])]
                  for t in TOOLS if not (synth[t] / "summary.json").exists()])
    joint = out / "joint"  # one store holding both tasks' demonstrations: SFT draws uniformly from it
    base = joint / "policy" / "sft"
    if not (base / "config.json").exists():
        joint.mkdir(parents=True, exist_ok=True)
        with open_store(f"sqlite:///{joint}/trajectories.db") as dst:
            if not any(True for _ in dst.iter_episodes(source="synth")):
                for t in TOOLS:
                    with open_store(f"sqlite:///{synth[t]}/trajectories.db") as src:
                        dst.put_many(list(src.iter_episodes(source="synth")))
        cli("train", TOOLS["finqa"], *sets([f'run_dir="{joint}"', 'stages=["sft"]', f"sft.steps={sft_steps}",
                                           "sft.batch_size=16", "sft.lr=3e-3", "sft.warmup_steps=30", *common]))
    rl = {t: out / f"rl-{t}" for t in TOOLS}  # each recipe's own RL stage, from the joint base
    cli_parallel([["train", TOOLS[t], *sets([f'run_dir="{rl[t]}"', 'stages=["rl"]', f'policy.init="{base}"',
                                            "rl.eval_every=0", *tool_set])]
                  for t in TOOLS if not (rl[t] / "policy" / "rl" / "config.json").exists()])
    a, b = (str(rl[t] / "policy" / "rl") for t in TOOLS)
    merges = {"linear": ["--method", "linear"],
              "task_arithmetic": ["--method", "task_arithmetic", "--base", str(base), "--weights", "1,1"],
              "ties": ["--method", "ties", "--base", str(base), "--weights", "1,1", "--density", "0.5"],
              "dare": ["--method", "dare", "--base", str(base), "--weights", "1,1", "--density", "0.5"]}
    for name, args in merges.items():
        if not (out / name / "config.json").exists():
            cli("merge", *args, "--out", str(out / name), a, b)
    models = {"base": base, **{f"rl-{t}": rl[t] / "policy" / "rl" for t in TOOLS}, **{m: out / m for m in merges}}
    calls = [["eval", TOOLS[t], "--checkpoint", str(p), *sets([f'run_dir="{out}/eval-{m}-{t}"', *tool_set])]
             for m, p in models.items() for t in TOOLS if not (out / f"eval-{m}-{t}" / "summary.json").exists()]
    for i in range(0, len(calls), 2):  # two evaluations at a time: one per core
        cli_parallel(calls[i:i + 2])
    scores = {m: {t: json.loads((out / f"eval-{m}-{t}" / "summary.json").read_text())["checkpoint"]["success"]
                  for t in TOOLS} for m in models}
    kept = {m: {t: scores[m][t] / max(scores[f"rl-{t}"][t], 1e-9) for t in TOOLS} for m in merges}
    return {"success": scores, "kept_of_specialist": kept}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["merge", "midtrain", "rl", "toolmerge"])
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--eval", type=int, default=128, help="held-out episodes per evaluation")
    p.add_argument("--sft-steps", type=int, default=60)
    p.add_argument("--replaced", type=int, default=20, help="SFT steps whose tokens mid-training gets instead")
    p.add_argument("--rl-iterations", type=int, default=15, help="rl: RL iterations on top of each midtrain arm")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="frozenlake", help="midtrain / rl: the recipe")
    p.add_argument("--mid-synth", type=int, default=1200, help="midtrain: noisy-expert episodes for mid-training")
    p.add_argument("--control", action="store_true",
                   help="midtrain: also SFT alone with the mid-trained arm's SFT steps (sft-short-SEED)")
    p.add_argument("--synth-each", type=int, default=9000, help="toolmerge: teacher episodes per tool task")
    p.add_argument("--joint-sft-steps", type=int, default=5000, help="toolmerge: steps of the joint SFT (batch 16)")
    p.add_argument("--set", action="append", default=[], dest="extra", metavar="KEY=VALUE",
                   help="toolmerge: a setting appended to every command (repeatable)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.what == "merge":
        result = bench_merge(out, args.eval)
    elif args.what == "toolmerge":
        result = bench_toolmerge(out, args.joint_sft_steps, args.synth_each, args.extra)
    elif args.what == "rl":
        result = bench_rl(out, [int(s) for s in args.seeds.split(",")], args.eval, args.rl_iterations, args.recipe)
    else:
        result = bench_midtrain(out, [int(s) for s in args.seeds.split(",")], args.eval, args.sft_steps, args.replaced,
                                args.recipe, args.mid_synth, args.control)
    (out / f"{args.what}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

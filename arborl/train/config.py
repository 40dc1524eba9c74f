"""The configuration tree of a training run (one frozen dataclass per component).

Example files live in ``examples/*.toml``; every field below can be set there or overridden on
the command line with ``--set section.field=value``.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from arborl.cluster.config import ClusterConfig
from arborl.config import ConfigError
from arborl.merge.config import MergeConfig
from arborl.policy import ModelConfig
from arborl.rollout import RolloutConfig

STAGES = ("synth", "midtrain", "sft", "rl", "merge", "eval")
DEFAULT_STAGES = ("synth", "sft", "rl", "eval")
"""What a run does when its config names no ``stages`` (mid-training and merging are opt-in)."""
LOGGERS = ("tensorboard", "wandb", "mlflow")


def _check_positive(obj: Any, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        if not v > 0:
            raise ValueError(f"{type(obj).__name__}.{n} must be > 0, got {v!r}")


@dataclass(frozen=True)
class EnvSpec:
    """Which environment to train on, by import path, and which seeds are train vs held out."""

    cls: str = "arborl.env.envs:FrozenLake"
    """Import path ``package.module:ClassName`` of the environment class (your own works too)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the class."""
    train_seed_start: int = 0
    """Training tasks use seeds ``train_seed_start + k`` for ``0 <= k < train_seed_count``."""
    train_seed_count: int = 1_000_000
    """How many distinct training seeds RL draws from (synth uses the first ``synth.episodes``)."""
    eval_seed_start: int = 1_000_000_000
    """Held-out evaluation tasks use seeds from here on (disjoint from training seeds)."""

    def __post_init__(self) -> None:
        if self.train_seed_count < 1:
            raise ValueError(f"EnvSpec.train_seed_count must be >= 1, got {self.train_seed_count}")
        if self.train_seed_start + self.train_seed_count > self.eval_seed_start:
            raise ValueError(
                "training seeds [train_seed_start, train_seed_start + train_seed_count) overlap the held-out "
                f"seeds starting at eval_seed_start={self.eval_seed_start}; lower train_seed_count or raise eval_seed_start"
            )


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass(frozen=True)
class PolicySpec:
    """The model: built from a config with a locally trained tokenizer, or loaded from a local path."""

    init: str = "scratch"
    """``scratch`` to build a small model from ``model``, a local Hugging Face checkpoint directory, a LoRA
    adapter directory (loaded onto the base it names), or a Hub id already in the local Hub cache."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Architecture of a scratch model (ignored when ``init`` is a path)."""
    system_prompt: str = ""
    """System message of every episode ("" for none)."""
    tokenizer_episodes: int = 300
    """Random-play episodes whose text trains the scratch tokenizer."""
    tokenizer: Literal["word", "bpe"] = "word"
    """The scratch tokenizer: ``word`` (one token per whitespace-separated word; an env's ``vocabulary`` makes
    every word known) or ``bpe`` (byte-level BPE, digits one by one: a word not in the training text is made of
    pieces that are, so a new name can be copied as a run of trained tokens; arborl/policy/tokenizer.py)."""
    tokenizer_vocab_size: int = 2000
    """``tokenizer = "bpe"``: the most tokens of the scratch BPE, the 6 specials and 256 byte tokens included.
    Smaller keeps rare names in frequent pieces; larger makes sequences shorter."""
    lora_rank: int = 0
    """RL trains a LoRA adapter of this rank on the attention projections instead of every weight (0: full
    fine-tuning; needs ``arborl[lora]``). Checkpoints hold the merged model and, in ``adapter/``, the adapter."""
    lora_alpha: float = 0.0
    """LoRA scale numerator (the update is ``alpha / rank * B A``); 0 means ``2 * lora_rank``."""
    gradient_checkpointing: bool = False
    """RL update: recompute each decoder layer in the backward pass instead of keeping its activations (same
    gradients, less memory, about one more forward of compute)."""
    autocast: Literal["none", "bf16"] = "none"
    """RL update: run the training forward in bfloat16 autocast (weights stay float32; rollouts and reference
    log-probs stay float32, so the ratio at the behaviour policy is only approximately 1)."""
    rollout_dtype: Literal["float32", "bfloat16"] = "float32"
    """RL rollouts on the local engine: ``bfloat16`` samples from a bfloat16 copy of the policy (its weights
    copied in after every update; attention and KV cache stay float32): up to 1.3x faster rollouts on CPUs with
    AVX-512 BF16 or AMX where large batches run on one thread (bench/rollout.py), no faster for the FrozenLake
    demo's short turns (docs/demo.md), several times slower on CPUs without native bf16. Its log-probs are not
    the trained float32 model's, so the update recomputes them and weights each token by the truncated ratio
    (``rl.recompute_logp``, docs/async.md). Evaluation and checkpoints stay float32."""
    device: str = "auto"
    """Where SFT, mid-training and RL train (model, reference, optimizer state, batches) and RL rollouts run:
    ``auto`` (CUDA when torch sees a GPU, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``. The final
    ``eval`` stage and ``arborl serve`` pick their own device."""
    backend: Literal["local", "http", "vllm"] = "local"
    """Where RL rollouts are generated: ``local`` in this process, ``http`` on the generation servers of
    ``urls`` (``arborl serve``, vLLM, SGLang; docs/serve.md), which get the new weights after every update,
    ``vllm`` on an in-process vLLM engine on the GPU (extra ``arborl[vllm]``; docs/serve.md)."""
    vllm_gpu_memory_utilization: float = 0.4
    """``backend = "vllm"``: the share of GPU memory vLLM may take for weights and KV cache (the trainer
    shares the GPU)."""
    urls: list[str] = field(default_factory=list)
    """``backend = "http"``: server roots, e.g. ``["http://127.0.0.1:8000"]``; episodes are spread over them,
    each sticking to one server."""
    http_api: Literal["openai", "sglang"] = "openai"
    """``backend = "http"``: the wire format, ``openai`` (``/v1/completions``: arborl serve, vLLM) or ``sglang``
    (``/generate``)."""
    http_model: str = ""
    """``backend = "http"``: the ``model`` field of ``openai`` requests ("" leaves it out; vLLM needs it)."""
    http_timeout_s: float = 120.0
    """``backend = "http"``: deadline of one generation request."""
    http_retries: int = 2
    """``backend = "http"``: further tries of a failed request (on another server when one is up); when all
    fail the episode ends with stop reason ``env_error`` and the run goes on."""
    frozen_embeddings: float = 0.0
    """When > 0, the word embeddings (tied to the output layer) are fixed random vectors: a scratch
    model's are drawn N(0, value^2) at build, and SFT and RL never train them. A word-level scratch
    tokenizer gives each name its own token; a held-out name's embedding would never be trained, so
    the model could not copy it. Fixed random embeddings make every name equally copyable (0: off)."""

    def __post_init__(self) -> None:
        if self.tokenizer == "bpe" and self.tokenizer_vocab_size < 262:
            raise ConfigError(f"policy.tokenizer_vocab_size is {self.tokenizer_vocab_size}; a BPE needs at least 262 "
                              "(6 specials and 256 byte tokens) and more for merges, e.g. 2000")
        if not self.frozen_embeddings >= 0:
            raise ConfigError(f"policy.frozen_embeddings is {self.frozen_embeddings}; use 0 (off) or a positive std "
                              "such as hidden_size ** -0.5")
        bad = [u for u in self.urls if not u.startswith(("http://", "https://"))]
        if bad:
            raise ConfigError(f"policy.urls: {bad} are not http(s) URLs; write them as http://HOST:PORT")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"policy.device is {self.device!r}; use auto (CUDA when present), cpu, cuda or cuda:N")
        if self.device.startswith("cuda") and not _cuda_available():
            raise ConfigError(f"policy.device = {self.device!r} but torch sees no GPU here; use auto or cpu")
        if self.backend == "vllm" and importlib.util.find_spec("vllm") is None:  # refused before any stage runs
            from arborl.rollout.vllm_policy import MISSING

            raise ConfigError(MISSING)
        if self.rollout_dtype != "float32" and self.backend != "local":
            raise ConfigError(f'policy.rollout_dtype = "{self.rollout_dtype}" sets the local engine\'s precision; with '
                              f'policy.backend = "{self.backend}" the servers choose theirs (vLLM: --dtype). Set '
                              'policy.rollout_dtype = "float32"')
        if not 0 < self.vllm_gpu_memory_utilization < 1:
            raise ConfigError(f"policy.vllm_gpu_memory_utilization is {self.vllm_gpu_memory_utilization}; use a "
                              "fraction in (0, 1), e.g. 0.4")
        if self.lora_rank < 0 or self.lora_alpha < 0:
            raise ConfigError("policy.lora_rank and policy.lora_alpha must be >= 0 (lora_rank 0: no adapter)")
        if self.http_retries < 0 or not self.http_timeout_s > 0:
            raise ConfigError("policy.http_retries must be >= 0 and policy.http_timeout_s > 0")


@dataclass(frozen=True)
class SynthConfig:
    """Expert demonstrations for the SFT cold start (uses the env's ``expert_action``)."""

    episodes: int = 2000
    """Number of expert episodes to synthesize and store."""
    only_successful: bool = True
    """Keep only episodes the expert finished successfully."""

    def __post_init__(self) -> None:
        _check_positive(self, "episodes")


@dataclass(frozen=True)
class SFTConfig:
    """Supervised cold start on stored demonstrations (same loss mask as RL)."""

    steps: int = 300
    """Optimizer steps."""
    batch_size: int = 32
    """Episodes per step."""
    lr: float = 1e-3
    """Peak learning rate (AdamW, linear warmup, cosine decay)."""
    warmup_steps: int = 20
    """Steps of linear learning-rate warm-up from 0 to ``lr`` before the cosine decay."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm of every step to this value."""
    eval_every: int = 100
    """Evaluate on the small held-out set every N steps (0: never)."""
    micro_batch_tokens: int = 0
    """Split each step's batch into length-sorted pieces of at most this many padded tokens (rows x
    width; a longer row is a piece alone) and accumulate their gradients into the one step, as
    ``rl.micro_batch_tokens`` does: the step is the unsplit one up to float rounding, but short
    demonstrations stop paying for the padding of long ones (a batch of 32 FrozenLake or search
    episodes is about half padding). 0: one pass per step."""

    def __post_init__(self) -> None:
        _check_positive(self, "steps", "batch_size", "lr", "grad_clip")
        if self.warmup_steps < 0 or self.eval_every < 0 or self.weight_decay < 0 or self.micro_batch_tokens < 0:
            raise ValueError("sft.warmup_steps, sft.eval_every, sft.weight_decay and sft.micro_batch_tokens "
                             "must be >= 0")


@dataclass(frozen=True)
class MidtrainConfig:
    """Mid-training: continued pre-training on every token of packed trajectories (arborl.train.midtrain)."""

    steps: int = 200
    """Optimizer steps."""
    seq_len: int = 1024
    """Tokens per packed row; documents are packed back to back, never attending across each other."""
    batch_size: int = 8
    """Packed rows per step (about: each step draws the documents that fill this many rows on average)."""
    lr: float = 1e-3
    """Peak learning rate of mid-training's own schedule (AdamW, linear warm-up, cosine decay to 10%)."""
    warmup_steps: int = 20
    """Steps of linear warm-up from 0 to ``lr``."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm of every step to this value."""
    data: list[str] = field(default_factory=lambda: ["store:midtrain-synth"])
    """Sources of documents: ``store:TAG`` (the run store's episodes with that source tag, e.g.
    ``store:midtrain-synth`` or ``store:synth``) or a JSONL file of episodes (one ``Episode.to_json()``
    a line, e.g. another tool task's)."""
    weights: list[float] = field(default_factory=list)
    """Mixture weight of each ``data`` source ([]: equal)."""
    synth_episodes: int = 2000
    """Episodes of the noisy synthesis (``store:midtrain-synth``), made when the store has none."""
    synth_noise: float = 0.3
    """Noisy synthesis: probability that a step takes a random legal action instead of the expert's."""

    def __post_init__(self) -> None:
        _check_positive(self, "steps", "seq_len", "batch_size", "lr", "grad_clip", "synth_episodes")
        if self.warmup_steps < 0 or self.weight_decay < 0:
            raise ValueError("midtrain.warmup_steps and midtrain.weight_decay must be >= 0")
        if not self.data:
            raise ConfigError("midtrain.data is empty; name a source, e.g. [\"store:midtrain-synth\"]")
        if self.weights and (len(self.weights) != len(self.data) or min(self.weights) < 0 or sum(self.weights) <= 0):
            raise ConfigError(f"midtrain.weights {self.weights} must give one non-negative weight per midtrain.data "
                              f"source ({len(self.data)}), not all 0")
        if not 0 <= self.synth_noise <= 1:
            raise ConfigError(f"midtrain.synth_noise = {self.synth_noise} is outside [0, 1]")


@dataclass(frozen=True)
class RLConfig:
    """Online RL: groups of rollouts per task, credit assignment, PPO-clip updates."""

    iterations: int = 100
    """RL iterations (each: rollouts, store, credit, ``ppo_epochs`` passes of updates)."""
    tasks_per_iter: int = 8
    """Distinct tasks (env seeds) per iteration."""
    group_size: int = 8
    """Rollouts per task (the GRPO group)."""
    lr: float = 3e-4
    """Peak learning rate of AdamW (betas 0.9, 0.99); see ``warmup_iters`` and ``lr_schedule``."""
    warmup_iters: int = 0
    """Raise the learning rate linearly over the first N iterations: a fresh Adam state at the start of
    RL otherwise takes sign-sized steps on every parameter, which knocks a small SFT model off its optimum."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After warm-up: keep ``lr``, or decay it along a half cosine to 0 at the last iteration (the final
    policy then comes out of small steps instead of the noise of full-size ones)."""
    ppo_epochs: int = 2
    """Passes over each iteration's batch."""
    minibatch_size: int = 32
    """Episodes per optimizer step."""
    micro_batch_tokens: int = 0
    """Split each minibatch's forward and backward pass into length-sorted pieces of at most this many
    padded tokens (rows x width; a longer row is a piece alone) and accumulate their gradients into the
    one optimizer step: the step is the unsplit one up to float rounding, but a piece is only as wide as
    its own longest row, so short rows stop paying for the padding of long ones. 0: one pass per
    minibatch. Applies with ``loss_agg = "token-mean"`` only (the other aggregations normalise by rows
    or by the padded width, which a split would change): with any other ``loss_agg`` each minibatch is
    one pass, as with 0."""
    prefix_share: int = 0
    """Train on each minibatch's prefix tree instead of its padded rows (:mod:`arborl.policy.packed`):
    every distinct prefix (the prompt a group shares, the trunk turns a branch or tree continuation
    carries, the chat template every row starts with) is computed once, in packed sequences of at
    most this many tokens (raised to the longest row) under a tree attention mask; with
    ``micro_batch_tokens`` the pieces hold at most that many distinct tokens. The log-probs and the
    step equal the padded pass's to float rounding. A minibatch is packed only where an estimate of
    its multiply-adds says packing costs less than padding (packs pay attention over the masked pairs
    of rows that share little), so the option never makes a pass much dearer. Llama and Qwen2 text
    policies (eager attention); others take the padded path. 0: off. Measured on one update pass
    (docs/demo.md, "Prefix-shared updates"): 1.7x faster for the demo's branch rows, 2.0x for the
    search recipe's groups of 8 (which sets it); the code agent's rows share too little and stay padded."""
    clip_low: float = 0.2
    """PPO clips the importance ratio from below at ``1 - clip_low``."""
    clip_high: float = 0.2
    """PPO clips the importance ratio from above at ``1 + clip_high`` (raise it above ``clip_low`` for
    DAPO's clip-higher)."""
    clip_c: float = 3.0
    """Dual-clip constant for negative advantages."""
    kl_coef: float = 0.05
    """Weight of the KL loss to the reference (start-of-RL) policy; 0 disables the reference model."""
    kl_kind: Literal["k1", "k2", "k3", "abs"] = "k3"
    """Per-token KL estimator (Schulman's k1 = log-ratio, k2 = half squared log-ratio, k3 = unbiased
    non-negative; ``abs`` = |log-ratio|); see ``arborl.loss.kl_estimate``."""
    entropy_coef: float = 0.0
    """Weight of the token-entropy bonus (subtracted from the loss; 0 disables it)."""
    credit: Literal["grpo", "rloo", "dr_grpo", "gigpo", "best_step", "tree", "turn_ppo", "archer", "prm",
                    "implicit_prm", "istar"] = "gigpo"
    """Credit estimator (see arborl.credit and docs/credit.md): ``grpo`` (group mean and std), ``rloo``
    (leave-one-out mean), ``dr_grpo`` (group mean only: ignores ``norm_by_std`` and ``length_neutral``),
    ``gigpo`` (episode + anchor-state step advantage), ``best_step`` (best return of each state), ``tree``
    (value of a turn's subtree minus its parent's, over tree rollouts: ``rl.tree``), ``turn_ppo``
    (turn-level GAE on a learned critic V), ``archer`` (Q - V of an off-policy turn-level critic);
    process rewards (arborl.prm; A = A^E + prm_weight * A^P): ``prm`` (explicit step scorer trained on
    Monte-Carlo targets, AgentPRM), ``implicit_prm`` (PRIME: beta * log-ratio of a model trained with
    cross-entropy on outcomes), ``istar`` (the same reward, model trained by trajectory DPO)."""
    singleton: Literal["raw", "zero"] = "raw"
    """What an episode with no peer in its group gets (grpo, rloo, dr_grpo, and gigpo's episode term):
    ``raw`` its score itself (A = R, verl's rule), ``zero`` nothing (no baseline, no signal)."""
    filter: Literal["none", "starpo_s"] = "none"
    """Trajectory filter applied before credit: ``starpo_s`` trains only on the ``keep_ratio`` of groups
    whose scores vary most (RAGEN's StarPO-S; its other stabilisers are ``kl_coef = 0`` and
    ``clip_high = 0.28``); it composes with any ``credit``."""
    keep_ratio: float = 0.25
    """StarPO-S: fraction of the iteration's groups kept, ``ceil(keep_ratio * tasks_per_iter)`` of them."""
    keep_zero_std: bool = True
    """StarPO-S: a group whose scores are all equal may be kept (false: never, so an iteration whose
    groups all agree trains on nothing and counts in ``train/filter_empty``)."""
    gamma: float = 0.95
    """Discount per turn of step returns (GiGPO, best_step) and of the critics' targets (turn_ppo, archer)."""
    gae_lambda: float = 0.9
    """turn_ppo: GAE's lambda over turns (1: Monte-Carlo return minus V; 0: one-step TD error)."""
    whiten_advantages: bool = True
    """turn_ppo: standardise the turn advantages over the batch, every episode weighing the same."""
    critic: Literal["head", "separate"] = "head"
    """turn_ppo: ``head``, an MLP on the policy's detached hidden state (the policy update is unchanged),
    or ``separate``, a copy of the policy's transformer body with its own head, trained end to end."""
    critic_lr: float = 1e-3
    """Learning rate of the critic's AdamW (turn_ppo, archer); Turn-PPO trains its critic faster than the actor."""
    critic_warmup: int = 0
    """For the first N iterations only the credit model (turn_ppo's or archer's critic) trains; the policy is
    not updated (with an estimator that has no model, nothing trains)."""
    critic_epochs: int = 4
    """turn_ppo: passes over the iteration's episodes per fit; archer: critic gradient steps per iteration."""
    critic_minibatch: int = 32
    """turn_ppo: episodes per critic step; archer: turns sampled from the replay buffer per critic step."""
    value_clip: float = 0.5
    """turn_ppo: a value moves at most this far from its old value before its loss stops pulling (0: plain MSE)."""
    archer_tau: float = 0.1
    """archer: soft update of the target critic after every critic step, target <- (1 - tau) target + tau online."""
    archer_replay_iters: int = 10
    """archer: the replay buffer holds the turns of the last N iterations (read back from the store)."""
    step_weight: float = 1.0
    """Weight w of the step advantage in A = A^E + w A^S (GiGPO)."""
    prm_weight: float = 1.0
    """Process rewards: weight w of the step term in A = A^E + w A^P (0: plain GRPO)."""
    anchor_weight: float = 0.0
    """Process rewards: weight w_S of GiGPO's anchor-state step term added to the advantage, A = A^E +
    prm_weight * A^P + anchor_weight * A^S (0: none). Where states repeat (Sokoban, FrozenLake), the steps
    taken from the same state are then also compared by their discounted returns (rl.gamma); ``arborl
    compare``'s ``prm_gigpo`` sets it to 1."""
    prm_step_norm: Literal["std", "none"] = "none"
    """Process rewards: keep the process returns on their own scale (``none``: the step term grows only as the
    reward model's scores separate; PRIME's beta * log-ratio after the leave-one-out baseline) or divide the
    step term by its group's std (``std``: every group's step term has unit spread, however little the scores
    differ, so a barely-trained reward model weighs as much as the outcome; docs/credit.md 12.6)."""
    prm_beta: float = 0.05
    """implicit_prm / istar: beta of the implicit reward beta * (log pi_phi - log pi_ref) (PRIME, iStar: 0.05)."""
    prm_lr: float = 1e-4
    """Process reward models: learning rate of their own AdamW optimizer."""
    prm_epochs: int = 1
    """Process reward models: passes over their training data after each policy update."""
    prm_minibatch_size: int = 32
    """Process reward models: episodes per optimizer step of the reward model."""
    prm_window: int = 4
    """prm: Monte-Carlo targets come from the ``rl`` episodes of the last N iterations, read from the store."""
    prm_buffer: int = 512
    """prm: at most this many episodes (the newest) from the store per fit."""
    prm_target_gamma: float = 0.95
    """prm: discount of the Monte-Carlo target, gamma^(steps to the end) * outcome (AgentPRM: 0.95)."""
    prm_dimensions: list[str] = field(default_factory=lambda: ["progress"])
    """prm: the named dimensions the scorer rates, each a separate named step reward whose target is a
    function of the stored turn (arborl.prm.explicit.DIMENSIONS: progress, tool_choice, query_quality,
    use_of_information; or ``package.module:function``). The step score is their mean."""
    prm_return_gamma: float = 1.0
    """implicit_prm / istar: discount of the process return-to-go summed over later turns (1: PRIME's
    reverse cumulative sum). ``prm`` uses 0: its scores already estimate the outcome from the step on."""
    prm_baseline: Literal["auto", "group", "previous", "rloo"] = "auto"
    """Process rewards: compare each step's score with the group's other steps (``group``), first take its
    difference to the episode's previous step's score (``previous``: with an explicit PRM's Q(s, a)
    estimates, a temporal-difference advantage), or first subtract the mean step score of the group's
    other episodes (``rloo``: PRIME's leave-one-out baseline, so a reward model's drift does not become
    a length bias through the return-to-go). ``auto``: ``group`` for prm, ``rloo`` for implicit_prm and
    istar. See docs/credit.md §12.1."""
    prm_pair_agg: Literal["mean", "sum"] = "mean"
    """istar: a trajectory's implicit reward in the DPO loss is the mean (iStar's code) or the sum (its
    paper) over its turns of beta * sum of log-ratios."""
    norm_by_std: bool = True
    """Divide group-relative advantages by the group's standard deviation (grpo, gigpo); false keeps the
    raw difference from the group mean. ``rloo`` and ``dr_grpo`` never divide."""
    length_neutral: bool = True
    """Give every episode the same total advantage weight regardless of its number of turns."""
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """How per-token losses reduce to one number (see ``arborl.loss.aggregate``): over all trained
    tokens, or per episode first."""
    drop_zero_advantage: bool = True
    """Leave episodes whose every token has zero advantage out of the update (they carry no signal,
    and in a token-mean loss they only dilute the step size of the informative ones)."""
    score_key: str = "success"
    """Which named episode reward is the outcome score."""
    error_policy: Literal["drop", "zero"] = "drop"
    """What the update does with an episode that ended on an env/tool error or a context overflow (stop
    reason ``env_error`` / ``max_context``): ``drop`` leaves it out of credit and the update, ``zero``
    trains on it with score and rewards 0. Both are counted (``train/env_errors``, ``train/max_context``)."""
    branch: bool = False
    """After each group rollout, branch every visited state with every action no group member took
    there and let the policy finish each branch (arborl.rollout.branch), so step-level credit
    compares all actions even when the group agrees. Needs an env with a finite ``actions`` set
    that is reproducible from its seed and actions."""
    branch_greedy: bool = True
    """Finish branches with greedy decoding: the return then measures ``Q(s, a)`` of the greedy
    policy (the one evaluated) without sampling noise. Needs ``rollout.sampling.temperature = 1``
    so the forced action's recorded log-prob matches the trainer's."""
    branch_states: int = 0
    """Branch at most this many visited states of each group, picked uniformly at random (0: every
    visited state). Each picked state still gets every untried action. Bounds the env steps branches
    take when episodes are long (Sokoban's failing rollouts run to the turn limit)."""
    tree: bool = False
    """After each group rollout, re-sample ``tree_k`` continuations from ``tree_nodes`` turns of each group
    (arborl.rollout.tree): the group becomes a tree whose shared prefixes give step-level credit
    (``rl.credit = "tree"``) where states never repeat. Needs an env reproducible from its seed and
    actions; no finite action set."""
    tree_k: int = 2
    """Tree rollouts: continuations re-sampled from each picked turn."""
    tree_nodes: int = 2
    """Tree rollouts: turns picked per group."""
    tree_select: Literal["uniform", "entropy"] = "uniform"
    """Tree rollouts: pick turns uniformly at random, or where the policy's entropy (the mean negative
    log-prob of the turn's sampled tokens) is highest."""
    tree_episode_weight: float = 1.0
    """Weight of the episode-level GRPO term in tree credit, A = A^T + w A^E."""
    update_threads: int = 0
    """torch intra-op threads for the reference log-probs and the PPO update only (rollouts and
    evaluation keep the run's ``threads``); 0: the run's ``threads``. Their large matmuls can use a
    second core that rollouts' many tiny ops only waste at every intra-op barrier, but only on cores
    no other process is using (see docs/demo.md)."""
    record_advantages: bool = True
    """Append each iteration's per-turn advantages to ``run_dir/advantages.jsonl`` (by turn id), which
    ``arborl view STORE --run RUN_DIR`` shows on each turn."""
    async_store: bool = True
    """Write each iteration's episodes to the store on a background thread and train on them from
    memory (the same batch a read-back gives); a failed write stops the run at the next iteration.
    False: write and read back on the critical path, as before."""
    max_staleness: int = 0
    """Asynchronous rollouts (docs/async.md): a worker (``rollout_worker``) samples the next iterations' batches while
    the update runs, at most this many policy versions behind the weights they train; the update corrects
    with decoupled PPO. 0: rollout and update alternate (synchronous). A resumed asynchronous run re-draws
    the batches that were in flight, so it is not bit-identical to an uninterrupted one."""
    rollout_worker: Literal["process", "thread"] = "process"
    """``max_staleness >= 1``: sample ahead in a second process (its own interpreter: no GIL shared with
    the update; weights cross over as a state dict after each update) or on a thread of this one
    (docs/async.md measures both)."""
    behav_cap: float = 5.0
    """Truncation of decoupled PPO's behaviour weight pi_prox / pi_behav per token (when the log-probs are
    recomputed: ``recompute_logp``)."""
    behav_mode: Literal["truncate", "mask"] = "truncate"
    """What the behaviour weight does past ``behav_cap``: ``truncate`` (set to the cap; the token still counts)
    or ``mask`` (a token whose weight leaves ``[1 / behav_cap, behav_cap]`` leaves the loss, denominator
    included; the others keep their untruncated weight). Masking suits a sampler in another precision, whose
    outlying tokens are numerical accidents (docs/async.md)."""
    recompute_logp: Literal["auto", "always", "never"] = "auto"
    """Recompute the batch's log-probs with the weights about to be updated (one no-grad forward, timed as
    ``ref_logp``) and train by decoupled PPO: the trust region around them, each token weighted by
    ``min(pi_prox / pi_behav, behav_cap)``. ``auto``: when the sampler's numbers are not the trainer's: a stale
    batch (``max_staleness``), ``policy.rollout_dtype`` other than float32 or ``policy.backend = "vllm"``
    (bf16 on the GPU); ``always``: every iteration (e.g. HTTP servers in another precision); ``never``: PPO to
    the recorded log-probs (refused with ``max_staleness``). ``policy.autocast`` is no reason: the recomputation
    has no gradient, so it runs in float32, as the sampler did."""
    grad_clip: float = 1.0
    """Clip the global gradient norm of every optimizer step to this value."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    checkpoint_every: int = 10
    """Write a resumable checkpoint every N iterations (0: only at the end)."""
    checkpoint_keep: int = 2
    """Keep only the newest N resumable checkpoints under ``run_dir/checkpoints`` (older ones are deleted)."""
    eval_every: int = 10
    """Evaluate on the small held-out set every N iterations (0: never)."""
    max_env_steps: int = 0
    """Stop RL before an iteration once its rollouts (the own turns of branches and tree
    continuations included, not their re-played prefixes) have taken this many environment
    steps, even short of ``iterations`` (0: no limit; ``arborl compare`` sets it)."""

    def __post_init__(self) -> None:
        _check_positive(self, "iterations", "tasks_per_iter", "group_size", "lr", "ppo_epochs", "minibatch_size",
                        "grad_clip", "checkpoint_keep", "tree_k", "tree_nodes")
        if self.branch_states < 0:
            raise ValueError(f"rl.branch_states is {self.branch_states}; use 0 (every visited state) or a positive count")
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ValueError(f"rl.clip_low must be in [0, 1) and rl.clip_high >= 0 (got {self.clip_low}, {self.clip_high})")
        if self.recompute_logp == "never" and self.max_staleness:
            raise ValueError(f"rl.recompute_logp = \"never\" with rl.max_staleness = {self.max_staleness}: a stale "
                             "batch needs the proximal policy's log-probs; set rl.recompute_logp = \"auto\"")
        if not self.behav_cap >= 1:
            raise ValueError(f"rl.behav_cap is {self.behav_cap}; truncate the behaviour weight at 1 or more (5 is usual)")
        if self.clip_c <= 1:
            raise ValueError(f"rl.clip_c is {self.clip_c}; the dual-clip constant must be > 1 (3 is usual)")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"rl.gamma is {self.gamma}; use a discount in [0, 1]")
        for name in ("kl_coef", "entropy_coef", "weight_decay", "warmup_iters", "checkpoint_every", "eval_every",
                     "update_threads", "max_env_steps", "max_staleness", "micro_batch_tokens", "prefix_share"):
            if getattr(self, name) < 0:
                raise ValueError(f"rl.{name} must be >= 0, got {getattr(self, name)!r}")
        self._check_credit()

    def _check_credit(self) -> None:
        """Rules between the credit fields."""
        if not 0 <= self.gae_lambda <= 1 or not 0 < self.archer_tau <= 1:
            raise ValueError(f"rl.gae_lambda must be in [0, 1] and rl.archer_tau in (0, 1] (got {self.gae_lambda}, "
                             f"{self.archer_tau})")
        for name in ("critic_lr", "critic_epochs", "critic_minibatch", "archer_replay_iters"):
            if not getattr(self, name) > 0:
                raise ValueError(f"rl.{name} must be > 0, got {getattr(self, name)!r}")
        if self.critic_warmup < 0 or self.value_clip < 0:
            raise ValueError("rl.critic_warmup and rl.value_clip must be >= 0")
        _check_positive(self, "prm_lr", "prm_epochs", "prm_minibatch_size", "prm_window", "prm_buffer", "prm_beta")
        for name in ("prm_target_gamma", "prm_return_gamma"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"rl.{name} is {getattr(self, name)}; use a discount in [0, 1]")
        if not self.prm_dimensions:
            raise ValueError("rl.prm_dimensions is empty; name at least one dimension, e.g. [\"progress\"]")
        if not 0 < self.keep_ratio <= 1:
            raise ValueError(f"rl.keep_ratio is {self.keep_ratio}; keep a fraction of the groups in (0, 1]")
        if self.credit == "dr_grpo" and self.loss_agg == "seq-mean-token-mean":
            raise ValueError("rl.credit = dr_grpo removes length normalisation, but rl.loss_agg = seq-mean-token-mean "
                             "divides each episode by its length; use token-mean or seq-mean-token-sum-norm")
        if self.anchor_weight and self.credit not in ("prm", "implicit_prm", "istar"):
            raise ValueError(f"rl.anchor_weight = {self.anchor_weight} adds GiGPO's step term to a process-reward "
                             f"method, but rl.credit = {self.credit!r}; use rl.credit = gigpo (its weight is "
                             "rl.step_weight) or one of prm, implicit_prm, istar")
        if self.credit == "tree" and not (self.tree or self.branch):
            raise ValueError("rl.credit = tree needs a rollout tree; set rl.tree = true (or rl.branch = true), or choose "
                             "another rl.credit")


@dataclass(frozen=True)
class EvalConfig:
    """Greedy evaluation on held-out tasks."""

    episodes: int = 512
    """Held-out tasks in the final evaluation."""
    probe_episodes: int = 64
    """Held-out tasks in the periodic evaluations that draw the learning curve."""
    greedy: bool = True
    """Evaluate with greedy decoding (false: sample with ``rollout.sampling``)."""

    def __post_init__(self) -> None:
        _check_positive(self, "episodes", "probe_episodes")


@dataclass(frozen=True)
class TrainConfig:
    """A whole run: ``synth -> midtrain -> sft -> rl -> merge -> eval`` (any subset, in this order)."""

    run_dir: str = "runs/default"
    """Where checkpoints, metrics, the store, summary.json and plots go."""
    seed: int = 0
    """Seed of every random stream (model init, tokenizer corpus, sampling, task draws, minibatch order)."""
    threads: int = 2
    """torch intra-op threads."""
    stages: list[str] = field(default_factory=lambda: list(DEFAULT_STAGES))
    """Stages to run, a subset of ``synth, midtrain, sft, rl, merge, eval`` (always run in that order)."""
    store: str = ""
    """Trajectory store URL; default ``sqlite:///<run_dir>/trajectories.db``."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Where metrics go besides ``run_dir/metrics.jsonl`` (always written): any of ``tensorboard``
    (``run_dir/tb``), ``wandb`` and ``mlflow`` (extras ``arborl[wandb]``, ``arborl[mlflow]``; they read
    ``WANDB_MODE``, ``WANDB_PROJECT``, ``MLFLOW_TRACKING_URI`` as usual), or ``[]``."""
    env: EnvSpec = field(default_factory=EnvSpec)
    """The environment and its train / held-out seeds."""
    policy: PolicySpec = field(default_factory=PolicySpec)
    """The initial model."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Episode budgets and token sampling, shared by synth, RL and evaluation."""
    synth: SynthConfig = field(default_factory=SynthConfig)
    """Expert demonstrations."""
    midtrain: MidtrainConfig = field(default_factory=MidtrainConfig)
    """Mid-training on packed whole trajectories (stage ``midtrain``)."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised cold start."""
    rl: RLConfig = field(default_factory=RLConfig)
    """Online RL."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    merge: MergeConfig = field(default_factory=MergeConfig)
    """Model merging of the run's policies or other checkpoints (stage ``merge``)."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Ray env workers (``address = ""``: none, the default; see docs/scale.md)."""

    def __post_init__(self) -> None:
        bad = [s for s in self.stages if s not in STAGES]
        if bad:
            raise ConfigError(f"stages: {bad} are unknown; choose from {list(STAGES)}")
        bad = [s for s in self.report_to if s not in LOGGERS]
        if bad:
            raise ConfigError(f"report_to: {bad} are unknown; choose from {list(LOGGERS)} (metrics.jsonl is always written)")
        _check_positive(self, "threads")
        self._check_branch_sampling()
        if self.policy.backend == "http" and not self.policy.urls and not self.cluster.generation_workers:
            raise ConfigError('policy.backend = "http" needs policy.urls, e.g. ["http://127.0.0.1:8000"] '
                              "(start one with `arborl serve CHECKPOINT`), or cluster.generation_workers")
        actors = self.cluster.generation == "actor"
        if self.cluster.generation_workers and not actors and self.policy.backend != "http":
            raise ConfigError('cluster.generation_workers generates for policy.backend = "http"; set it, or '
                              'cluster.generation = "actor" (actors that hold the policy), or '
                              "cluster.generation_workers = 0 to generate in this process")
        if actors and self.policy.backend != "local":
            raise ConfigError(f'cluster.generation = "actor" runs the in-process engine in Ray actors, not policy.backend '
                              f'= "{self.policy.backend}"; set policy.backend = "local", or cluster.generation = "http"')
        if self.rl.max_staleness and self.rl.rollout_worker == "process" and self.cluster.address and not actors:
            raise ConfigError('rl.rollout_worker = "process" builds its own local envs, so it would not use the '
                              'cluster\'s env workers; set rl.rollout_worker = "thread" with cluster.address, or '
                              'cluster.generation = "actor" (the generation actors sample ahead)')
        if self.policy.backend in ("http", "vllm") and self.rl.branch:
            raise ConfigError(f'rl.branch = true needs policy.backend = "local" (not "{self.policy.backend}"): a branch '
                              "forces an action and scores it with prompt log-probs, which generation servers do not "
                              "return. Set rl.branch = false (rl.tree works over HTTP and vLLM)")

    def _check_branch_sampling(self) -> None:
        """Greedy branches record their forced action's log-prob at temperature 1; sampling must match."""
        sampling = self.rollout.sampling
        if self.rl.branch and self.rl.branch_greedy and not sampling.greedy and sampling.temperature != 1.0:
            raise ConfigError(
                f"rl.branch_greedy = true needs rollout.sampling.temperature = 1 (it is {sampling.temperature}): a "
                "greedy branch records its forced action's log-prob at temperature 1. Set "
                "rollout.sampling.temperature = 1 or rl.branch_greedy = false"
            )

    @property
    def store_url(self) -> str:
        """The configured store URL, or the SQLite file in ``run_dir``."""
        return self.store or f"sqlite:///{self.run_dir}/trajectories.db"

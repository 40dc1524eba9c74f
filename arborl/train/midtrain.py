"""Agentic mid-training: continued pre-training on whole rendered trajectories, packed.

Unlike SFT, which trains only on the tokens the policy wrote (the rollout's loss mask), mid-training
trains on every token of a trajectory's main path: system prompt, observations and tool results
included, so the model learns what tool use and its results look like before it is taught to act
(Tongyi DeepResearch's agentic continual pre-training). The departures from that recipe:

* Documents are the stored token ids (token-in, token-out), never re-tokenized text.
* Documents are packed back to back into rows of ``midtrain.seq_len`` tokens; a document longer
  than a row is cut into row-sized pieces, each its own document. Attention never crosses a
  document boundary: each row gets a block-diagonal causal mask (a 4D additive mask) and positions
  restart at 0 with every document, so a document's logits are the same packed or alone
  (``tests/train/test_midtrain.py`` checks it). The first token of a document has no prediction.
* Data come from several sources mixed by weight (``midtrain.data``, ``midtrain.weights``): each
  document is drawn from source ``i`` with probability ``w_i / sum w``. A source is episodes of
  the run's store with a given ``source`` tag (``store:TAG``) or a JSONL file of episodes (one
  ``Episode.to_json()`` per line, e.g. from another task's run).
* The default source, ``store:midtrain-synth``, is a large, lower-quality set made by
  :func:`synthesize_noisy`: the env's expert, replaced with probability ``midtrain.synth_noise`` by a
  random action (:func:`noisy_expert`), every episode kept; the env answers each action for real.

The learning-rate schedule is its own (``midtrain.lr``, ``warmup_steps``, ``steps``): linear warm-up
then cosine decay to 10%, the shape SFT uses. The checkpoint goes to ``run_dir/policy/midtrain``;
SFT then starts from it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from arborl.config import ConfigError
from arborl.env import Env
from arborl.loss import sft_loss
from arborl.policy import load_policy, save_policy
from arborl.policy.model import resolve_device, to_device
from arborl.train.config import TrainConfig
from arborl.train.interrupt import between_steps
from arborl.train.loggers import Metrics
from arborl.train.progress import progress
from arborl.train.sft import lr_schedule
from arborl.train.stages import policy_dir, synthesize
from arborl.trajectory import Episode, content_hash, linearize

NOISY_SOURCE = "midtrain-synth"
"""Store ``source`` tag of the episodes :func:`synthesize_noisy` writes."""


@dataclass
class PackedBatch:
    """Documents packed into fixed-length rows.

    Attributes:
        input_ids: ``[B, T]`` long (padding: the pad id).
        position_ids: ``[B, T]`` long, the position of each token within its document.
        doc: ``[B, T]`` long, the document index of each token within its row; -1 on padding.
        loss_mask: ``[B, T]`` float, 1 on every token predicted from its own document's tokens
            (all but each document's first token), 0 on padding.
    """

    input_ids: Tensor
    position_ids: Tensor
    doc: Tensor
    loss_mask: Tensor

    def attention_bias(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """``[B, 1, T, T]`` additive mask: 0 where query ``i`` may see key ``j`` (same document, ``j <= i``)."""
        t = self.doc.shape[1]
        same = self.doc[:, :, None] == self.doc[:, None, :]  # (B, T, T)
        causal = torch.ones(t, t, dtype=torch.bool, device=self.doc.device).tril()
        allowed = same & causal & (self.doc[:, None, :] >= 0)
        allowed |= torch.eye(t, dtype=torch.bool, device=self.doc.device)  # a padding query sees itself: no row all -inf
        bias = torch.zeros(allowed.shape, dtype=dtype, device=self.doc.device).masked_fill_(~allowed, torch.finfo(dtype).min)
        return bias[:, None]


def pack(docs: Sequence[Sequence[int]], seq_len: int, *, pad_id: int = 0) -> PackedBatch:
    """Pack documents in order into rows of ``seq_len`` tokens (a longer document is cut into pieces).

    Args:
        docs: Token id lists, one per document.
        seq_len: Row length T.
        pad_id: Id of the padding at the end of a row that the next document does not fit.

    Returns:
        The rows; a document never spans two rows.
    """
    pieces = [list(d[i:i + seq_len]) for d in docs for i in range(0, len(d), seq_len) if d]
    rows: list[list[list[int]]] = [[]]
    for piece in pieces:
        if sum(map(len, rows[-1])) + len(piece) > seq_len:
            rows.append([])
        rows[-1].append(piece)
    rows = [r for r in rows if r]
    b = max(len(rows), 1)
    ids = torch.full((b, seq_len), pad_id, dtype=torch.long)
    pos = torch.zeros((b, seq_len), dtype=torch.long)
    doc = torch.full((b, seq_len), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        at = 0
        for k, piece in enumerate(row):
            n = len(piece)
            ids[i, at:at + n] = torch.tensor(piece, dtype=torch.long)
            pos[i, at:at + n] = torch.arange(n)
            doc[i, at:at + n] = k
            at += n
    mask = ((doc >= 0) & (pos > 0)).float()
    return PackedBatch(ids, pos, doc, mask)


def packed_logprobs(model, batch: PackedBatch) -> Tensor:
    """``[B, T]`` log-prob of each token given the earlier tokens of its own document (0 where unmasked)."""
    bias = batch.attention_bias(next(model.parameters()).dtype)
    out = model(input_ids=batch.input_ids, attention_mask=bias, position_ids=batch.position_ids, use_cache=False)
    return logprobs_from_logits(out.logits, batch)


def logprobs_from_logits(logits: Tensor, batch: PackedBatch) -> Tensor:
    """``[B, T]`` log-probs of the packed tokens from ``[B, T, V]`` logits, 0 where ``loss_mask`` is 0."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V): predicts tokens 1..T-1
    picked = logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    full = torch.cat([picked.new_zeros(picked.shape[0], 1), picked], dim=1)
    return full * batch.loss_mask


def document(episode: Episode) -> list[int]:
    """Every token of the episode's main path, prompts (observations, tool results) and outputs alike."""
    return list(linearize(episode).input_ids)


def load_sources(cfg: TrainConfig, store) -> list[list[Episode]]:
    """The episodes of each ``midtrain.data`` source, in a stable order."""
    out = []
    for spec in cfg.midtrain.data:
        if spec.startswith("store:"):
            eps = list(store.iter_episodes(source=spec[len("store:"):]))
        else:
            path = Path(spec)
            if not path.is_file():
                raise ConfigError(f"midtrain.data: {spec!r} is neither store:TAG nor a JSONL file; export episodes with "
                                  "`arborl store export` or name a store source tag")
            eps = [Episode.from_json(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not eps:
            raise ConfigError(f"midtrain.data: {spec!r} holds no episodes; synthesize them first (midtrain.synth_episodes) "
                              "or point to another source")
        out.append(sorted(eps, key=lambda e: (e.task_id, content_hash(e))))
    return out


def mixture(sources: list[list[list[int]]], weights: Sequence[float], n: int, gen: random.Random) -> list[list[int]]:
    """``n`` documents, each from source ``i`` with probability ``w_i / sum w`` and uniform within it."""
    picks = gen.choices(range(len(sources)), weights=weights, k=n)
    return [sources[i][gen.randrange(len(sources[i]))] for i in picks]


def noisy_expert(noise: float, rng: random.Random) -> Callable[[Env], str]:
    """An actor that takes the env's expert action, or with probability ``noise`` a random one.

    The random action is the env's own ``random_action(rng)`` when it defines one (e.g. a tool env's
    well-formed call with random arguments, which the env still executes for real), else a uniform
    pick from its finite ``actions``; an env with neither always gets the expert's action.
    """

    def act(env: Env) -> str:
        expert = getattr(env, "expert_action", None)
        if expert is None or rng.random() < noise:
            own = getattr(env, "random_action", None)
            legal = [str(a) for a in getattr(env, "actions", ())]
            if callable(own):
                return str(own(rng))
            if legal:
                return rng.choice(legal)
        if expert is None:
            raise ConfigError(f"{type(env).__name__} has no expert_action(), random_action() or finite actions list; "
                              "the noisy synthesis needs one of them")
        return expert()

    return act


def synthesize_noisy(cfg: TrainConfig, make_env: Callable[[], Env], policy_path: Path, store) -> list[Episode]:
    """The lower-quality mid-training set: a noisy expert, every episode kept, stored as :data:`NOISY_SOURCE`."""
    act = noisy_expert(cfg.midtrain.synth_noise, random.Random(cfg.seed + 17))
    return synthesize(cfg, make_env, policy_path, store, act=act, source=NOISY_SOURCE,
                      episodes=cfg.midtrain.synth_episodes, only_successful=False,
                      seed_start=cfg.env.train_seed_start + cfg.synth.episodes)


def train_midtrain(cfg: TrainConfig, make_env: Callable[[], Env], init_path: Path, store,
                   metrics: Metrics) -> tuple[Path, dict[str, float]]:
    """Run mid-training from ``init_path``; returns the checkpoint dir and the data statistics."""
    mc = cfg.midtrain
    if f"store:{NOISY_SOURCE}" in mc.data and not any(True for _ in store.iter_episodes(source=NOISY_SOURCE)):
        synthesize_noisy(cfg, make_env, init_path, store)
    device = resolve_device(cfg.policy.device)
    model, tok = load_policy(init_path, device=device)
    sources = [[document(e) for e in eps] for eps in load_sources(cfg, store)]
    vocab = model.get_input_embeddings().num_embeddings
    top = max(max(d, default=0) for s in sources for d in s)
    if top >= vocab:
        raise ConfigError(f"midtrain.data holds token id {top} but the policy's vocabulary has {vocab}; mid-train on "
                          "episodes rendered with this policy's tokenizer")
    weights = mc.weights or [1.0] * len(sources)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=mc.lr, weight_decay=mc.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_schedule(s, total=mc.steps, warmup=mc.warmup_steps))
    gen = random.Random(cfg.seed + 3)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    mean_len = sum(len(d) for s in sources for d in s) / max(1, sum(len(s) for s in sources))
    per_step = max(1, round(mc.batch_size * mc.seq_len / max(mean_len, 1.0)))  # documents that fill batch_size rows
    tokens = 0
    shown: dict[str, float] = {}
    for step in between_steps(progress(range(mc.steps), "midtrain", status=shown)):
        batch = to_device(pack(mixture(sources, weights, per_step, gen), mc.seq_len, pad_id=pad), device)
        out = sft_loss(packed_logprobs(model, batch), batch.loss_mask)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), mc.grad_clip)
        opt.step()
        sched.step()
        tokens += int(batch.loss_mask.sum().item())
        row = {"loss/midtrain": out.terms["loss/sft"], "grad_norm": float(gnorm), "lr": sched.get_last_lr()[0],
               "tokens": tokens, "rows": batch.input_ids.shape[0]}
        metrics.log("midtrain", step + 1, row)
        shown.update(loss=row["loss/midtrain"])
    model.eval()
    out_dir = save_policy(model, tok, policy_dir(cfg, "midtrain"))
    return out_dir, {"midtrain_tokens": tokens, "midtrain_documents": sum(len(s) for s in sources)}

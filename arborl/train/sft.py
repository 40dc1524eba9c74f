"""SFT cold start: maximise the likelihood of stored demonstration tokens under the same loss mask RL uses.

Reads the episodes the ``synth`` stage stored (``source="synth"``) back from the trajectory
store, trains on their exact token ids (never re-tokenized text), and writes a Hugging Face
checkpoint to ``<run_dir>/policy/sft``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from arborl.env import Env
from arborl.loss import sft_loss
from arborl.policy import load_policy, save_policy, token_logprobs
from arborl.policy.model import resolve_device, to_device
from arborl.rollout.media import image_inputs
from arborl.store.base import StoreError
from arborl.store.url import redact
from arborl.train.batch import TokenBatch, collate, length_chunks, micro_chunks
from arborl.train.config import TrainConfig
from arborl.train.embeddings import freeze_embeddings
from arborl.train.interrupt import between_steps
from arborl.train.loggers import Metrics
from arborl.train.progress import progress
from arborl.train.stages import evaluate, policy_dir
from arborl.trajectory import content_hash


def lr_schedule(step: int, *, total: int, warmup: int) -> float:
    """Linear warmup then cosine decay to 10% of the peak."""
    if step < warmup:
        return (step + 1) / max(1, warmup)
    frac = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def _step_gradients(model, batch: TokenBatch, micro_batch_tokens: int) -> dict[str, float]:
    """Accumulate the gradient of the batch's token-mean SFT loss; returns its terms.

    With ``micro_batch_tokens`` the rows run length-sorted in pieces of at most that many padded
    tokens (:func:`arborl.train.batch.micro_chunks`), each piece's loss weighted by its share of the
    batch's trained tokens, so the gradient is the whole batch's up to float rounding.
    """
    if micro_batch_tokens:
        rows = length_chunks(batch, len(batch.input_ids))[0]  # every row, sorted by length
        pieces = [batch.select(p) for p in micro_chunks(batch, rows, micro_batch_tokens)]
    else:
        pieces = [batch]
    total = max(float(batch.loss_mask.sum()), 1.0)
    loss = 0.0
    for sub in pieces:
        logp = token_logprobs(model, sub.input_ids, sub.attention_mask, positions=sub.loss_mask,
                              pixel_values=sub.pixel_values)
        out = sft_loss(logp, sub.loss_mask)
        share = float(sub.loss_mask.sum()) / total if len(pieces) > 1 else 1.0
        (out.loss * share).backward()
        loss += share * out.terms["loss/sft"]
    return {"loss/sft": loss}


def train_sft(
    cfg: TrainConfig, make_env: Callable[[], Env], init_path: Path, store, metrics: Metrics
) -> tuple[Path, dict[str, float]]:
    """Run SFT; returns the checkpoint dir and the demonstration statistics."""
    out = policy_dir(cfg, "sft")
    # A stable order independent of ids and timestamps, so a rerun of the same config trains identically.
    demos = sorted(store.iter_episodes(source="synth"), key=lambda e: (e.task_id, content_hash(e)))
    if not demos:
        raise StoreError(f"no synth episodes in {redact(cfg.store_url)}; run the synth stage first (arborl synth CONFIG)")
    device = resolve_device(cfg.policy.device)
    model, tok = load_policy(init_path, device=device)
    model.train()
    sc = cfg.sft
    params = freeze_embeddings(model, cfg.policy.frozen_embeddings)
    opt = torch.optim.AdamW(params, lr=sc.lr, weight_decay=sc.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_schedule(s, total=sc.steps, warmup=sc.warmup_steps))
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    demo_turns = sum(len(e.path()) for e in demos)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    images = image_inputs(model, store)  # a vision policy's images, read back by reference
    seen: set[int] = set()
    shown: dict[str, float] = {}
    for step in between_steps(progress(range(sc.steps), "sft", status=shown)):
        idx = torch.randint(len(demos), (sc.batch_size,), generator=gen).tolist()
        seen.update(idx)
        batch = to_device(collate([demos[i] for i in idx], pad_id=pad, images=images), device)
        opt.zero_grad(set_to_none=True)
        terms = _step_gradients(model, batch, sc.micro_batch_tokens)
        gnorm = torch.nn.utils.clip_grad_norm_(params, sc.grad_clip)
        opt.step()
        sched.step()
        env_steps = int(demo_turns * len(seen) / len(demos))
        row = {**terms, "grad_norm": float(gnorm), "lr": sched.get_last_lr()[0], "env_steps": env_steps}
        if sc.eval_every and ((step + 1) % sc.eval_every == 0 or step + 1 == sc.steps):
            model.eval()
            row.update(evaluate(cfg, make_env, model, tok, n=cfg.eval.probe_episodes, label="probe"))
            model.train()
        metrics.log("sft", step + 1, row)
        shown.update({"loss": row["loss/sft"], **{k: row[k] for k in ("success", "reward") if k in row}})
    model.eval()
    save_policy(model, tok, out)
    return out, {"demo_episodes": len(demos), "demo_turns": demo_turns}

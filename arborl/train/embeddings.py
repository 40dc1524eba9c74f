"""Fixed random word embeddings for scratch policies (``policy.frozen_embeddings``).

arborl's scratch tokenizer is word-level, so every name of a generated world is one token. A
token that appears only in held-out questions and passages would keep its initial embedding
while training pushes the trained ones around (and, through the tied output layer, every softmax
pushes unseen tokens away from the states that predict names), so the policy cannot copy a name it
never saw, which is the whole skill of a search agent. With fixed random embeddings (drawn once,
near-orthogonal in ``hidden_size`` dimensions, tied to the output layer) a copy learned on
training names works the same on any name: the body learns to move a token's vector to the
position that predicts it, and the output layer scores that vector against every word alike.
A pretrained model with a subword tokenizer does not need this.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def redraw_embeddings(model: PreTrainedModel, std: float, *, seed: int) -> None:
    """Draw the input embedding matrix (the tied output layer too) from N(0, std^2), seeded."""
    weight = model.get_input_embeddings().weight
    gen = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=gen) * std)


def freeze_embeddings(model: PreTrainedModel, frozen: float) -> list[torch.nn.Parameter]:
    """The parameters to train: all but the (tied) word embeddings when ``frozen`` > 0."""
    if frozen:
        model.get_input_embeddings().weight.requires_grad_(False)
    return [p for p in model.parameters() if p.requires_grad]

"""arborl.policy: tokenizer, model factory, portable checkpoints, chat rendering and per-token log-probs."""

from arborl.policy.chat import ChatRenderer, Observation, TemplateError, observation_text
from arborl.policy.logprobs import token_logprobs, token_logprobs_and_entropy
from arborl.policy.model import (
    ATTN_IMPLEMENTATION,
    ModelConfig,
    add_lora,
    build_model,
    load_policy,
    merge_lora,
    resolve_device,
    save_adapter,
    save_policy,
)
from arborl.policy.portable import CheckpointError, stock_tokenizer_problem
from arborl.policy.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, train_tokenizer

__all__ = [
    "ATTN_IMPLEMENTATION",
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "ChatRenderer",
    "CheckpointError",
    "ModelConfig",
    "Observation",
    "TemplateError",
    "add_lora",
    "build_model",
    "load_policy",
    "merge_lora",
    "observation_text",
    "resolve_device",
    "save_adapter",
    "save_policy",
    "stock_tokenizer_problem",
    "token_logprobs",
    "token_logprobs_and_entropy",
    "train_tokenizer",
]

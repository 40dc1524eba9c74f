"""arborl.policy: tokenizer, model factory, portable checkpoints, chat rendering and per-token log-probs."""

from arborl.policy.chat import ChatRenderer, Observation, TemplateError, observation_text
from arborl.policy.logprobs import token_logprobs, token_logprobs_and_entropy
from arborl.policy.model import ATTN_IMPLEMENTATION, ModelConfig, build_model, load_policy, save_policy
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
    "build_model",
    "load_policy",
    "observation_text",
    "save_policy",
    "stock_tokenizer_problem",
    "token_logprobs",
    "token_logprobs_and_entropy",
    "train_tokenizer",
]

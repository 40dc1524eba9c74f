"""The rollout tests' deterministic stand-ins (tiny tokenizer, renderer and random model) for tool rollouts."""

from tests.rollout.conftest import _one_torch_thread, model, renderer, tokenizer  # noqa: F401  (fixtures)

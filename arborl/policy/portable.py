"""Does a stock loader read a tokenizer back exactly as arborl uses it?

Every tool that loads a Hugging Face checkpoint (``transformers``, TRL, vLLM) builds its
tokenizer with ``AutoTokenizer.from_pretrained``, and transformers 5 picks the tokenizer *class*
from the model type before it looks at ``tokenizer.json``: for ``qwen2`` checkpoints it always
builds ``Qwen2Tokenizer``, a byte-level BPE whose normaliser and pre-tokenizer are fixed in code
and whose vocabulary is taken from the file. A word-level tokenizer saved beside a Qwen2 model
comes back with its words gone (the FrozenLake prompt becomes ``<|user|> <|end|> <|assistant|>``).

:func:`stock_tokenizer_problem` saves the tokenizer next to a stub ``config.json`` of the model
type, loads it the way those tools do and compares the two pipelines part by part (normaliser,
pre-tokenizer, model with its vocabulary and merges, decoder, post-processor, added tokens),
the chat template and the special tokens. ``build_model`` and ``save_policy`` refuse a
tokenizer it finds a problem with, so no checkpoint arborl writes is misread elsewhere.

:func:`save_tokenizer` writes the tokenizer files both use. transformers 5 names the class of a
plain ``tokenizers``-backed tokenizer ``TokenizersBackend`` in ``tokenizer_config.json``, a name
transformers 4 does not know (4.57 refuses the checkpoint: "Tokenizer class TokenizersBackend
does not exist"), and many serving stacks still pin 4.x; the file says
``PreTrainedTokenizerFast`` instead, the name of the same class in both major versions.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

_PIPELINE_PARTS = ("model", "normalizer", "pre_tokenizer", "decoder", "post_processor", "added_tokens")
_SPECIAL = ("eos_token", "pad_token", "unk_token", "bos_token")


class CheckpointError(ValueError):
    """A policy checkpoint would be read differently outside arborl; the message says why and the fix."""


def stock_tokenizer_problem(tokenizer: PreTrainedTokenizerBase, model_type: str) -> str | None:
    """What ``AutoTokenizer`` gets wrong when it loads ``tokenizer`` from a ``model_type`` checkpoint.

    Args:
        tokenizer: The tokenizer the policy is trained with (a fast, ``tokenizers``-backed one).
        model_type: ``config.model_type`` of the model it is saved beside (``"llama"``, ``"qwen2"``).

    Returns:
        ``None`` when the stock loader rebuilds the same tokenizer, else one sentence naming the
        class it builds and the first part that differs.
    """
    with tempfile.TemporaryDirectory(prefix="arborl-tok-") as tmp:
        save_tokenizer(tokenizer, tmp)
        Path(tmp, "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
        stock = AutoTokenizer.from_pretrained(tmp)
    where = f"AutoTokenizer loads a {model_type!r} checkpoint's tokenizer as {type(stock).__name__}"
    ours, theirs = _pipeline(tokenizer), _pipeline(stock)
    for part in _PIPELINE_PARTS:
        if ours.get(part) != theirs.get(part):
            return f"{where}, whose {part.replace('_', '-')} differs from the saved one ({_kind(ours, part)} saved, {_kind(theirs, part)} loaded)"
    if stock.chat_template != tokenizer.chat_template:
        return f"{where}, which does not read the chat template back"
    for name in _SPECIAL:
        if getattr(stock, name) != getattr(tokenizer, name):
            return f"{where}, whose {name} is {getattr(stock, name)!r} instead of {getattr(tokenizer, name)!r}"
    return None


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, path: str | Path) -> None:
    """``tokenizer.save_pretrained(path)``, with a class name transformers 4 and 5 both read."""
    tokenizer.save_pretrained(path)
    config_file = Path(path) / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _pipeline(tokenizer: PreTrainedTokenizerBase) -> dict:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return {}
    return json.loads(backend.to_str())


def _kind(pipeline: dict, part: str) -> str:
    value = pipeline.get(part)
    if isinstance(value, dict):
        size = len(value.get("vocab") or ())
        return f"{value.get('type', 'untyped')}" + (f" with {size} entries" if size else "")
    if isinstance(value, list):
        return f"{len(value)} entries"
    return "none" if value is None else type(value).__name__

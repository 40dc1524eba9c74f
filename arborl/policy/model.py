"""Build, save and load causal-LM policies as standard Hugging Face checkpoints.

:func:`build_model` makes a tiny randomly initialised Qwen2 or Llama model sized to a tokenizer;
:func:`save_policy` writes a checkpoint directory (``config.json``, ``model.safetensors``,
tokenizer files with the chat template) that plain ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` read exactly as arborl does: both refuse, with
:class:`~arborl.policy.portable.CheckpointError`, a model type whose stock tokenizer class would
rebuild the tokenizer differently (see :mod:`arborl.policy.portable`). :func:`load_policy` reads
any local HF causal-LM checkpoint directory that ships a chat template (e.g. a downloaded
Qwen2.5-0.5B-Instruct), so nothing downstream assumes the tiny model, and still reads the
Qwen2-with-word-level-tokenizer checkpoints older arborl versions wrote (with a warning).

Attention runs with the ``eager`` implementation: on CPU it is as fast as ``sdpa`` for these
sizes, and it gives the same numbers whether keys come from a kept KV cache or a fresh forward
pass (the rollout relies on that; see ``tests/rollout``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from arborl.policy import hf_vision, vision
from arborl.policy.portable import CheckpointError, save_tokenizer, stock_tokenizer_problem

ATTN_IMPLEMENTATION = "eager"
"""Attention kernel used for every policy this module builds or loads."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a policy built from scratch (defaults: ~2M parameters with a small vocabulary)."""

    arch: Literal["qwen2", "llama"] = "llama"
    """Architecture family: ``llama`` or ``qwen2`` (adds q/k/v biases). A from-scratch policy's
    word-level tokenizer needs ``llama``: transformers loads every ``qwen2`` checkpoint with its
    byte-level ``Qwen2Tokenizer``, which drops the words, so ``build_model`` refuses ``qwen2``
    with that tokenizer (``qwen2`` works with a Qwen2 tokenizer)."""
    hidden_size: int = 256
    """Width of the residual stream; must be divisible by ``num_heads``."""
    num_layers: int = 2
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads per layer."""
    num_kv_heads: int = 4
    """Key/value heads (grouped-query attention); must divide ``num_heads``."""
    intermediate_size: int = 688
    """Hidden width of the MLP."""
    max_position_embeddings: int = 2048
    """Longest token sequence (whole multi-turn episode) the model can attend over."""
    tie_word_embeddings: bool = True
    """Share the input embedding and output projection matrices."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding frequencies."""
    image_size: int = 0
    """Side in pixels of the images the policy reads (a patch encoder before the LM, see
    :mod:`arborl.policy.vision`; ``arch`` must be ``llama``); 0: a text-only policy."""
    patch_size: int = 4
    """Side of an image patch; each patch is one placeholder token (used when ``image_size`` > 0)."""

    def __post_init__(self) -> None:
        if self.arch not in ("qwen2", "llama"):
            raise ValueError(f"ModelConfig.arch is {self.arch!r}; use 'qwen2' or 'llama'")
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelConfig.{name} is {value!r}; use a positive integer")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"ModelConfig.hidden_size ({self.hidden_size}) is not divisible by num_heads "
                f"({self.num_heads}); pick num_heads that divides hidden_size"
            )
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"ModelConfig: head size hidden_size/num_heads = {self.hidden_size // self.num_heads} is odd; "
                "rotary embeddings need an even head size"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_kv_heads ({self.num_kv_heads}) does not divide num_heads ({self.num_heads}); "
                "use a divisor of num_heads"
            )
        if self.image_size and (self.arch != "llama" or self.image_size % self.patch_size):
            raise ValueError(f"ModelConfig: image_size {self.image_size} needs arch 'llama' and a patch_size that "
                             f"divides it (got arch {self.arch!r}, patch_size {self.patch_size})")
        if not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rope_theta is {self.rope_theta!r}; use a positive number")


def build_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, *, seed: int) -> PreTrainedModel:
    """A randomly initialised causal LM whose vocabulary matches ``tokenizer``.

    Args:
        cfg: Model shape.
        tokenizer: Tokenizer the model reads; it must define ``eos_token_id`` and ``pad_token_id``. With
            ``cfg.image_size`` the ``<image>`` placeholder token is added to it (save it with the model).
        seed: Seed of the weight initialisation (same seed, same weights).

    Returns:
        The model in float32, eval mode, with ``eager`` attention.

    Raises:
        CheckpointError: stock loaders would read ``tokenizer`` differently beside a ``cfg.arch``
            model (e.g. the word-level tokenizer with ``qwen2``).
    """
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no eos_token or pad_token; set both before building a model")
    image_token = vision.add_image_token(tokenizer) if cfg.image_size else None  # the tokenizer gains <image>
    _require_portable(tokenizer, cfg.arch, "cannot build this policy")
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_theta)},
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    if image_token is not None:
        hf_cfg = vision.vision_config(common, image_size=cfg.image_size, patch_size=cfg.patch_size,
                                      image_token_id=image_token)
    else:
        hf_cfg = Qwen2Config(**common) if cfg.arch == "qwen2" else LlamaConfig(**common)
    hf_cfg._attn_implementation = ATTN_IMPLEMENTATION
    # Seed a private generator state: building a model must not disturb the caller's RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=ATTN_IMPLEMENTATION)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.float().eval()


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Write ``model`` and ``tokenizer`` as a standard HF checkpoint directory.

    Args:
        model: Any HF causal LM; a LoRA model (:func:`add_lora`) is written merged.
        tokenizer: Its tokenizer; must carry a chat template.
        path: Directory to write (created if missing; existing files are overwritten).

    Returns:
        The directory path.

    Raises:
        CheckpointError: ``AutoTokenizer`` would read the saved tokenizer differently (nothing is
            written then).
    """
    if not tokenizer.chat_template:
        raise ValueError("the tokenizer has no chat_template; set one so the checkpoint can render chats")
    out = Path(path)
    if is_lora(model):  # an export is a plain checkpoint: the adapter merged into a copy of the base
        model = merge_lora(model)
    _require_portable(tokenizer, model.config.model_type, f"refusing to write {str(out)!r}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tokenizer, out)
    return out


_Batch = TypeVar("_Batch")


def context_length(config) -> int | None:
    """Longest sequence a model attends over; None if its config does not say.

    ``max_position_embeddings`` of the config, or of its text config for a vision-language model
    (Qwen2-VL keeps it in ``text_config``).
    """
    n = getattr(config, "max_position_embeddings", None)
    if n is None and hasattr(config, "get_text_config"):
        n = getattr(config.get_text_config(), "max_position_embeddings", None)
    return n


def resolve_device(device: str) -> torch.device:
    """The torch device a ``device`` setting names: ``auto`` is CUDA when present, else the CPU.

    Raises:
        ValueError: the name is not a torch device, or names CUDA on a machine without it.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a torch device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asks for CUDA but torch sees no GPU here; use auto or cpu")
    return dev


def to_device(batch: _Batch, device: torch.device) -> _Batch:
    """A copy of a dataclass of tensors (a training batch) with every tensor field on ``device``.

    On the device the batch is already on, it is returned as is (no copy: CPU runs are unchanged).
    """
    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}  # type: ignore[arg-type]
    if all(not isinstance(v, torch.Tensor) or v.device == device for v in fields.values()):
        return batch
    return dataclasses.replace(batch, **{k: v.to(device) for k, v in fields.items() if isinstance(v, torch.Tensor)})


def load_policy(path: str | Path, *, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local HF causal-LM checkpoint directory and its tokenizer.

    Args:
        path: Directory with ``config.json``, weights and tokenizer files with a chat template; or
            a LoRA adapter directory (:func:`save_adapter`), loaded onto its base; or a Hugging Face
            Hub id (``Qwen/Qwen2.5-0.5B-Instruct``) already in the local Hub cache.
        dtype: Dtype of the loaded weights.
        device: Where the weights go (a torch device, or a name :func:`resolve_device` reads).

    Returns:
        ``(model, tokenizer)``; the model is in eval mode with ``eager`` attention.

    Raises:
        FileNotFoundError: the directory or its ``config.json`` is missing.
        ValueError: the tokenizer has no chat template or no end-of-sequence token.
        ConfigError: a vision-language checkpoint of a type arborl does not run (the message names
            the supported ones, :data:`arborl.policy.hf_vision.SUPPORTED_VLM_TYPES`).
    """
    d = _local_dir(path)
    if (d / ADAPTER_CONFIG).is_file() and not (d / "config.json").is_file():
        return _load_adapter(d, dtype=dtype, device=device)
    if not d.is_dir():
        raise FileNotFoundError(
            f"policy checkpoint {str(d)!r} is not a directory; pass a directory written by save_policy "
            "or a downloaded Hugging Face model directory"
        )
    if not (d / "config.json").is_file():
        raise FileNotFoundError(
            f"policy checkpoint {str(d)!r} has no config.json; it is not a Hugging Face model directory "
            "(point to the folder that holds config.json and the weights)"
        )
    vlm = hf_vision.vlm_type(d)  # before the tokenizer: an unsupported VLM type is named first
    tokenizer = _load_tokenizer(d)
    if not tokenizer.chat_template:
        raise ValueError(
            f"the tokenizer in {str(d)!r} has no chat template; use an instruct/chat checkpoint or set "
            "tokenizer.chat_template and save it with save_policy"
        )
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer in {str(d)!r} has no eos_token; set one and save it again")
    if vlm is not None:  # a stock vision-language checkpoint (Qwen2-VL, Qwen2.5-VL)
        model = hf_vision.load_vlm(d, vlm, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
    else:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    return model.to(dev).eval(), tokenizer


def _require_portable(tokenizer: PreTrainedTokenizerBase, model_type: str, what: str) -> None:
    problem = stock_tokenizer_problem(tokenizer, model_type)
    if problem is not None:
        raise CheckpointError(
            f"{what}: {problem}, so transformers, TRL and vLLM would feed the model other tokens than arborl. "
            "Fix: build from-scratch policies with policy.model.arch = 'llama' (its checkpoints keep "
            "tokenizer.json as written), or use a tokenizer made for this architecture"
        )


def _load_tokenizer(d: Path) -> PreTrainedTokenizerBase:
    """``AutoTokenizer``, unless it rebuilt a tokenizer that disagrees with ``tokenizer.json``.

    transformers maps some model types (e.g. ``qwen2``) to a tokenizer class that rebuilds a BPE
    model from the vocabulary and ignores the model stored in ``tokenizer.json``; a word-level
    tokenizer saved beside a Qwen2-architecture model (what arborl wrote before it checked this)
    would then lose its words. The file wins, with a warning: other tools still misread it.
    """
    tokenizer = AutoTokenizer.from_pretrained(d)
    file = d / "tokenizer.json"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if file.is_file() and backend is not None:
        stored = json.loads(file.read_text(encoding="utf-8")).get("model", {}).get("type")
        loaded = json.loads(backend.to_str()).get("model", {}).get("type")
        if stored is not None and stored != loaded:
            warnings.warn(
                f"{str(d)!r} was written by an older arborl: plain transformers (AutoTokenizer) reads its "
                f"{stored} tokenizer as a {loaded} {type(tokenizer).__name__} and loses its words, so TRL and vLLM "
                "misread it too. arborl reads tokenizer.json as written and can evaluate it, but save_policy refuses "
                "to write it again; retrain with policy.model.arch = 'llama' for a portable checkpoint",
                UserWarning,
                stacklevel=3,
            )
            tokenizer = PreTrainedTokenizerFast.from_pretrained(d)
    return tokenizer


# --- LoRA (peft) ---------------------------------------------------------------------------------
ADAPTER_CONFIG = "adapter_config.json"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
"""Modules a LoRA adapter wraps by default: the attention projections (as in the LoRA paper, §4.2)."""


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries a peft adapter."""
    return hasattr(model, "peft_config")


def add_lora(model: PreTrainedModel, *, rank: int, alpha: float | None = None, dropout: float = 0.0,
             targets: tuple[str, ...] = LORA_TARGETS, base: str | Path | None = None) -> PreTrainedModel:
    """Wrap ``model`` in a LoRA adapter: only the adapter's ``A, B`` matrices are trainable.

    ``B`` starts at zero, so the wrapped model computes exactly what ``model`` did. Dropout
    defaults to 0: behaviour and training log-probs must be the same function. ``base`` (the
    checkpoint ``model`` was loaded from) is recorded for :func:`save_adapter`.

    Raises:
        ImportError: peft is not installed (``pip install 'arborl[lora]'``).
    """
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA rank is {rank!r}; use a positive integer (e.g. 8)")
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=rank, lora_alpha=float(alpha if alpha is not None else 2 * rank), lora_dropout=dropout,
                     target_modules=list(targets), bias="none", task_type="CAUSAL_LM")
    if base is not None:
        cfg.base_model_name_or_path = str(Path(base).resolve())
    return get_peft_model(model, cfg)


def save_adapter(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path,
                 base: str | Path | None = None) -> Path:
    """Write only the adapter of a LoRA model (and the tokenizer) to ``path``; ``base`` is recorded in it
    (default: the base given to :func:`add_lora`).

    :func:`load_policy` on ``path`` loads ``base`` and applies the adapter; :func:`save_policy`
    writes the merged model instead.
    """
    if not is_lora(model):
        raise ValueError("save_adapter needs a LoRA model (add_lora); save a plain model with save_policy")
    out = Path(path)
    if base is not None:
        model.peft_config["default"].base_model_name_or_path = str(Path(base).resolve())
    if not model.peft_config["default"].base_model_name_or_path:
        raise ValueError("save_adapter: name the base checkpoint (base=...) so the adapter can be loaded onto it")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tokenizer, out)
    return out


def load_weights(model: PreTrainedModel, checkpoint: str | Path) -> None:
    """Set ``model``'s trainable weights from a checkpoint written by the trainer, in place.

    A plain model takes every weight of ``checkpoint``; a LoRA model takes only its adapter, from
    ``checkpoint/adapter`` (the base stays the one it was built on).
    """
    d = Path(checkpoint)
    if not is_lora(model):
        model.load_state_dict(load_policy(d)[0].state_dict())
        return
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    file = d / "adapter" / "adapter_model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(f"{str(d)!r} has no adapter/adapter_model.safetensors; it was not written by a "
                                "LoRA run (resume it with policy.lora_rank = 0)")
    set_peft_model_state_dict(model, load_file(str(file)))


def merge_lora(model: PreTrainedModel) -> PreTrainedModel:
    """A plain model with the adapter's ``B A`` added into the base weights (``model`` is left as it is)."""
    import copy

    return copy.deepcopy(model).merge_and_unload()


def _load_adapter(d: Path, *, dtype: torch.dtype, device: str | torch.device) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from peft import PeftModel

    base = json.loads((d / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base:
        raise FileNotFoundError(f"the adapter in {str(d)!r} does not name its base model (base_model_name_or_path)")
    model, _ = load_policy(base, dtype=dtype, device=device)
    tokenizer = _load_tokenizer(d) if (d / "tokenizer_config.json").is_file() else _load_tokenizer(Path(base))
    return PeftModel.from_pretrained(model, d).eval(), tokenizer


def _local_dir(path: str | Path) -> Path:
    """``path``, or the local Hub-cache snapshot of a Hub id (the download itself is the user's)."""
    d = Path(path)
    text = str(path)
    if d.exists() or text.count("/") != 1 or text.startswith((".", "/")):
        return d
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(text, local_files_only=True))
    except Exception:
        raise FileNotFoundError(
            f"policy checkpoint {text!r} is neither a local directory nor a Hub id in the local Hub cache; "
            f"download it first (`hf download {text}`) or pass the directory that holds config.json"
        ) from None


# --- memory options of the training forward ----------------------------------------------------
def set_training_options(model: PreTrainedModel, *, gradient_checkpointing: bool = False,
                         autocast: Literal["none", "bf16"] = "none") -> PreTrainedModel:
    """Make the forward passes that record gradients cheaper in memory; gradient-free ones stay as they are.

    Both act only while ``torch.is_grad_enabled()``: the rollout (inference mode) and the reference
    and old log-probs (no grad) run in float32 without recomputation, as before.

    Args:
        model: The policy (a LoRA model too); changed in place and returned.
        gradient_checkpointing: Keep only each decoder layer's input for the backward pass and
            recompute the layer there (``torch.utils.checkpoint``, non-reentrant). Gradients are
            the same; activation memory drops from every layer's intermediates to one tensor per
            layer. Unlike transformers' own switch it works in eval mode, which the trainer keeps.
        autocast: ``bf16`` runs the forward under ``torch.autocast`` in bfloat16 (weights and
            optimizer stay float32). The trained log-probs are then bf16 numbers, while behaviour
            log-probs were recorded in float32: the importance ratio at the behaviour policy is no
            longer exactly 1 (a precision mismatch, not a bug).
    """
    if autocast not in ("none", "bf16"):
        raise ValueError(f"autocast is {autocast!r}; use 'none' or 'bf16'")
    if gradient_checkpointing:
        from transformers.modeling_layers import GradientCheckpointingLayer

        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        if not layers:
            raise ValueError(f"{type(model).__name__} has no decoder layers to checkpoint")
        for layer in layers:  # a partial, not a closure: a deepcopy (merge_lora) then binds the copy's layer
            layer.forward = functools.partial(_checkpointed_forward, layer)
    if autocast == "bf16":
        model.forward = functools.partial(_autocast_forward, model, torch.bfloat16)
    return model


def _checkpointed_forward(layer: torch.nn.Module, *args, **kwargs):
    forward = type(layer).forward
    if not torch.is_grad_enabled() or kwargs.get("cache") is not None:  # a recompute would append to the cache twice
        return forward(layer, *args, **kwargs)
    from torch.utils.checkpoint import checkpoint

    return checkpoint(forward, layer, *args, use_reentrant=False, **kwargs)


def _autocast_forward(model: torch.nn.Module, dtype: torch.dtype, *args, **kwargs):
    forward = type(model).forward
    if not torch.is_grad_enabled():
        return forward(model, *args, **kwargs)
    device = next(model.parameters()).device.type
    with torch.autocast(device, dtype=dtype):
        return forward(model, *args, **kwargs)

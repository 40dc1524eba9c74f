"""Merge Hugging Face checkpoints tensor by tensor, streaming from and to safetensors.

:func:`merge_checkpoints` checks that the sources are one architecture (``config.json``), hold the
same tensors with the same shapes, and ship the same tokenizer, raising
:class:`~arborl.config.ConfigError` that names the first difference; then, for one tensor name at
a time, it reads that tensor from each source (``safe_open``, opened per read so no mapping of a
whole file stays resident), merges it with a function of :mod:`arborl.merge.methods`, and appends
it to the output ``model.safetensors``. The output's header is written first (every shape and
dtype is known from the sources' headers), so peak memory is a few copies of the largest tensor,
not of a model. The result is a checkpoint directory with the first model's ``config.json``,
``generation_config.json`` and tokenizer files, which :func:`arborl.policy.load_policy` and plain
``AutoModelForCausalLM.from_pretrained`` read.

Floating tensors are merged in float32 and written in the first model's dtype; other tensors
(integer buffers) must be equal in every source and are copied.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import shutil
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from arborl.config import ConfigError
from arborl.merge import methods
from arborl.merge.config import MergeConfig

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
"""safetensors dtype names and the torch dtypes they hold."""

_LIBC = ctypes.CDLL(ctypes.util.find_library("c")) if ctypes.util.find_library("c") else None
if _LIBC is not None and not hasattr(_LIBC, "malloc_trim"):  # not glibc (e.g. musl, macOS)
    _LIBC = None

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")
"""Files of a checkpoint that make up its tokenizer: compared between sources, copied to the output."""

CONFIG_IGNORED = ("transformers_version", "_name_or_path", "dtype", "torch_dtype")

TOKENIZER_CONFIG_IGNORED = ("is_local", "local_files_only", "name_or_path", "_commit_hash")
"""``tokenizer_config.json`` keys that record how a tokenizer was loaded, not what it does (transformers
writes them after a ``from_pretrained`` -> ``save_pretrained`` round trip, as every training stage does)."""
"""``config.json`` keys that may differ between checkpoints of one architecture."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor of a checkpoint is, and its dtype name and shape."""

    file: Path
    dtype: str
    shape: tuple[int, ...]


class Checkpoint:
    """A Hugging Face checkpoint directory's config and tensor index (nothing loaded)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not (self.path / "config.json").is_file():
            raise ConfigError(f"merge: {str(self.path)!r} has no config.json; pass Hugging Face checkpoint directories")
        self.config: dict[str, Any] = json.loads((self.path / "config.json").read_text(encoding="utf-8"))
        self.tensors = _tensor_index(self.path)

    def load(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """A fresh float32 copy of tensor ``name``, or of its rows ``[r0, r1)`` (read from disk on every call)."""
        info = self.tensors[name]
        with safe_open(str(info.file), framework="pt") as f:
            t = f.get_tensor(name) if rows is None else f.get_slice(name)[rows[0]:rows[1]]
        return t.to(torch.float32) if t.dtype != torch.float32 else t


def _tensor_index(d: Path) -> dict[str, TensorInfo]:
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({d / f for f in json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()})
    elif (d / "model.safetensors").is_file():
        files = [d / "model.safetensors"]
    else:
        raise ConfigError(f"merge: {str(d)!r} has no model.safetensors (or its index); save the model with "
                          "safe_serialization=True (arborl's save_policy does)")
    out: dict[str, TensorInfo] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
                s = f.get_slice(name)
                out[name] = TensorInfo(file, s.get_dtype(), tuple(s.get_shape()))
    return out


def check_compatible(sources: list[Checkpoint]) -> None:
    """Raise ConfigError naming the first tensor, config key or tokenizer file where a source differs from the first.

    Tensors come first: two sizes of one architecture then name the first tensor whose shape differs.
    """
    first = sources[0]
    for other in sources[1:]:
        where = f"merge: {str(other.path)!r} differs from {str(first.path)!r}"
        for name, info in first.tensors.items():
            mine = other.tensors.get(name)
            if mine is None or mine.shape != info.shape:
                got = "missing" if mine is None else f"shape {list(mine.shape)}"
                raise ConfigError(f"{where}: tensor {name} is {got}, not shape {list(info.shape)}; merge checkpoints of "
                                  "one architecture")
        extra = sorted(set(other.tensors) - set(first.tensors))
        if extra:
            raise ConfigError(f"{where}: it has tensor {extra[0]} the first does not; merge checkpoints of one architecture")
        keys = sorted((set(first.config) | set(other.config)) - set(CONFIG_IGNORED))
        for k in keys:
            if first.config.get(k) != other.config.get(k):
                raise ConfigError(f"{where}: config.json {k} is {other.config.get(k)!r}, not {first.config.get(k)!r}; "
                                  "merge checkpoints of one architecture")
        _check_tokenizer(first.path, other.path, where)


def _check_tokenizer(a: Path, b: Path, where: str) -> None:
    for name in TOKENIZER_FILES:
        fa, fb = a / name, b / name
        if fa.is_file() != fb.is_file():
            raise ConfigError(f"{where}: tokenizer file {name} is in only one of them; merged weights need one tokenizer")
        if fa.is_file() and _file_value(fa) != _file_value(fb):
            raise ConfigError(f"{where}: tokenizer file {name} differs, so token ids mean different things; merge "
                              "checkpoints that share a tokenizer")


def _file_value(f: Path) -> Any:
    data = f.read_bytes()
    if f.suffix != ".json":
        return data
    value = json.loads(data)
    if f.name == "tokenizer_config.json":
        value = {k: v for k, v in value.items() if k not in TOKENIZER_CONFIG_IGNORED}
    return value


def resolve_path(name: str, run_dir: str | Path | None) -> Path:
    """A run policy name (``init``, ``midtrain``, ``sft``, ``rl``, ``merge``) as ``run_dir/policy/<name>``, else the path."""
    if run_dir is not None and name in ("init", "midtrain", "sft", "rl", "merge"):
        return Path(run_dir) / "policy" / name
    return Path(name)


def merge_checkpoints(cfg: MergeConfig, out: str | Path, *, run_dir: str | Path | None = None) -> Path:
    """Merge ``cfg.models`` (onto ``cfg.base``) with ``cfg.method`` and write the checkpoint ``out``.

    Args:
        cfg: Method, sources and options.
        out: Output directory (created; its ``model.safetensors`` is replaced).
        run_dir: Resolves run policy names in ``cfg.models`` / ``cfg.base`` (None: paths only).

    Returns:
        The output directory.

    Raises:
        ConfigError: a source is not a safetensors checkpoint, or sources differ in architecture,
            tensors, shapes or tokenizer (the message names the first difference).
    """
    models = [Checkpoint(resolve_path(m, run_dir)) for m in cfg.models]
    base = Checkpoint(resolve_path(cfg.base, run_dir)) if cfg.base else None
    check_compatible(models + ([base] if base is not None else []))
    dest = Path(out)
    if any(dest.resolve() == c.path.resolve() for c in models + ([base] if base else [])):
        raise ConfigError(f"merge: the output {str(dest)!r} is one of the sources; write the merge to a new directory")
    dest.mkdir(parents=True, exist_ok=True)
    first = models[0]
    tmp = dest / "model.safetensors.tmp"
    with tmp.open("wb") as f:
        _write_header(f, first.tensors)
        for name, info in first.tensors.items():
            for merged in _pieces(cfg, name, info, models, base):
                f.write(merged.to(DTYPES[info.dtype]).contiguous().view(torch.uint8).numpy())
                del merged
            _release_freed_memory()
    tmp.replace(dest / "model.safetensors")
    for name in ("config.json", "generation_config.json", *TOKENIZER_FILES):
        if (first.path / name).is_file():
            shutil.copyfile(first.path / name, dest / name)
    return dest


CHUNK_ELEMENTS = 1 << 18
"""Entries per slice of TIES's elementwise part (1 MB of float32)."""


def _spans(info: TensorInfo) -> list[tuple[int, int]] | None:
    """Row ranges of about :data:`CHUNK_ELEMENTS` entries each, or None for a tensor merged whole."""
    numel = math.prod(info.shape)
    if not DTYPES[info.dtype].is_floating_point or numel <= CHUNK_ELEMENTS or len(info.shape) < 2:
        return None
    step = max(1, CHUNK_ELEMENTS // (numel // info.shape[0]))
    return [(r, min(r + step, info.shape[0])) for r in range(0, info.shape[0], step)]


def _pieces(cfg: MergeConfig, name: str, info: TensorInfo, models: list[Checkpoint],
            base: Checkpoint | None) -> Iterator[torch.Tensor]:
    """The merged tensor ``name``, whole or as consecutive row slices (what the output file takes in order).

    Elementwise methods (linear, task_arithmetic, dare) merge a large tensor slice by slice; TIES
    does too, with the whole tensor's magnitude thresholds (:func:`_ties_thresholds`); slerp needs
    the angle between whole tensors and merges them whole.
    """
    spans = _spans(info) if cfg.method != "slerp" else None
    if spans is None:
        yield _merge_one(cfg, name, info, models, base)
        return
    if cfg.method != "ties":
        for span in spans:
            yield _merge_one(cfg, name, info, models, base, rows=span)
        return
    assert base is not None  # MergeConfig requires a base for ties
    thresholds = _ties_thresholds(cfg, name, info, models, base, spans)
    for span in spans:
        b = base.load(name, span)
        yield methods.ties_combine(b, [m.load(name, span).sub_(b) for m in models], cfg.resolved_weights(),
                                   thresholds, scale=cfg.scale)


def _ties_thresholds(cfg: MergeConfig, name: str, info: TensorInfo, models: list[Checkpoint], base: Checkpoint,
                     spans: list[tuple[int, int]]) -> list[float]:
    """Each model's TIES magnitude threshold over the whole tensor, from one ``|theta_i - base|`` buffer filled by slices."""
    numel = math.prod(info.shape)
    per_row = numel // info.shape[0]
    mag = torch.empty(numel, dtype=torch.float32)  # one buffer for every model: a second tensor-sized
    out = []                                       # allocation could land on the heap and stay resident
    for m in models:
        for r0, r1 in spans:
            b = base.load(name, (r0, r1))
            mag[r0 * per_row:r1 * per_row] = m.load(name, (r0, r1)).sub_(b).abs_().view(-1)
            del b
        out.append(methods.magnitude_threshold(mag, cfg.density))
    del mag
    _release_freed_memory()
    return out


def _release_freed_memory() -> None:
    """Hand the heap pages freed by the last tensor back to the OS (glibc's ``malloc_trim``; no-op elsewhere).

    glibc raises its mmap threshold after the first large free, so later tensor-sized temporaries come
    from the heap, and freed heap pages count in the process's resident memory until trimmed.
    """
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _merge_one(cfg: MergeConfig, name: str, info: TensorInfo, models: list[Checkpoint],
               base: Checkpoint | None, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """The merged value of tensor ``name`` (of its rows ``[r0, r1)`` when ``rows`` is given)."""
    if not DTYPES[info.dtype].is_floating_point:
        value = models[0].load(name)
        for m in models[1:] + ([base] if base else []):
            if not torch.equal(m.load(name), value):
                raise ConfigError(f"merge: non-float tensor {name} differs between {str(models[0].path)!r} and "
                                  f"{str(m.path)!r}; such buffers cannot be averaged")
        return value

    def load(i: int) -> torch.Tensor:
        return models[i].load(name, rows)

    def load_base(_: int) -> torch.Tensor:
        assert base is not None
        return base.load(name, rows)

    weights = cfg.resolved_weights()
    if cfg.method == "linear":
        return methods.linear(load, weights)
    if cfg.method == "slerp":
        return methods.slerp(load, cfg.t)
    if cfg.method == "task_arithmetic":
        return methods.task_arithmetic(load, load_base, weights)
    if cfg.method == "ties":
        return methods.ties(load, load_base, weights, density=cfg.density, scale=cfg.scale)
    first_row = 0 if rows is None else rows[0]  # each slice of a large tensor draws its own masks
    gen = torch.Generator().manual_seed((cfg.seed * 1_000_003 + zlib.crc32(name.encode()) * 7919 + first_row) % 2**63)
    return methods.dare(load, load_base, weights, density=cfg.density, generator=gen)


def _write_header(f, tensors: dict[str, TensorInfo]) -> None:
    """The safetensors header: little-endian u64 length, then JSON with each tensor's byte range."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, info in tensors.items():
        size = DTYPES[info.dtype].itemsize
        for d in info.shape:
            size *= d
        header[name] = {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)

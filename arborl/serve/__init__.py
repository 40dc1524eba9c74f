"""arborl.serve: an OpenAI-compatible HTTP server over an arborl checkpoint (``arborl serve``).

Names are imported on first use, so ``arborl --help`` (which registers ``serve``) stays fast.
"""

from typing import Any

_NAMES = {"PolicyServer": "arborl.serve.app", "create_app": "arborl.serve.app",
          "ServedModel": "arborl.serve.engine", "decode_steps": "arborl.serve.engine"}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'arborl.serve' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_NAMES[name]), name)

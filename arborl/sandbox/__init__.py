"""Isolated execution of untrusted Python snippets behind one interface.

>>> from arborl.sandbox import Sandbox, Limits
>>> with Sandbox(backend="bwrap", limits=Limits(wall_s=5)) as sb:
...     result = sb.run_python("print(1)")

Backends (threat model of each in its module docstring and in ``docs/sandbox.md``): ``bwrap``
(default), ``zygote`` (warm fast path), ``process`` (weaker fallback), ``docker``, ``wasm``.
"""

from arborl.sandbox.base import Backend, ExecResult, Limits, SandboxError
from arborl.sandbox.core import BACKENDS, Sandbox

__all__ = ["BACKENDS", "Backend", "ExecResult", "Limits", "Sandbox", "SandboxError"]

"""The :class:`Sandbox` facade: pick a backend by name, run snippets, close.

The one table that maps backend names to classes is :data:`BACKENDS`; ``docker`` and ``wasm``
are imported lazily (they pull optional dependencies). Every call is independent: backends start
each run from a clean scratch directory, and concurrent calls from threads (or asyncio tasks via
:meth:`Sandbox.arun_python`) are safe.
"""

from __future__ import annotations

import asyncio
import importlib
from types import TracebackType

from arborl.sandbox.base import Backend, ExecResult, Limits, SandboxError
from arborl.sandbox.bwrap import BwrapBackend
from arborl.sandbox.process import ProcessBackend
from arborl.sandbox.zygote import ZygoteBackend

# The one name -> backend table. Strings are "module:Class", imported on first use.
BACKENDS: dict[str, type | str] = {
    "bwrap": BwrapBackend,
    "process": ProcessBackend,
    "zygote": ZygoteBackend,
    "docker": "arborl.sandbox.docker:DockerBackend",
    "wasm": "arborl.sandbox.wasm:WasmBackend",
}
# Preference order of the default backend ("auto").
DEFAULT_ORDER = ("bwrap", "zygote", "docker", "wasm", "process")


def backend_class(name: str) -> type:
    """Resolve a backend name to its class.

    Raises:
        ValueError: Unknown name (the message lists the valid ones).
        SandboxError: The backend's module cannot be imported.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {name!r}; choose one of {sorted(BACKENDS)} or 'auto'")
    entry = BACKENDS[name]
    if isinstance(entry, type):
        return entry
    module, _, attr = entry.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise SandboxError(f"backend {name!r} cannot be loaded from {entry} ({exc})") from exc


def probe_backend(name: str) -> str | None:
    """``None`` if backend ``name`` works here, else the reason (import failures included)."""
    try:
        cls = backend_class(name)
    except SandboxError as exc:
        return str(exc)
    try:
        return cls.probe()
    except Exception as exc:  # a broken probe means "not available", with the reason
        return f"probe of {name!r} failed: {exc!r}"


class Sandbox:
    """Run untrusted Python snippets in an isolated backend.

    Example:
        >>> with Sandbox(backend="bwrap", limits=Limits(wall_s=5)) as sb:
        ...     sb.run_python("print(1)").stdout
        '1\\n'
    """

    def __init__(
        self, backend: str = "auto", limits: Limits | None = None, *, proxy_socket: str | None = None
    ) -> None:
        """Start (or prepare) the backend.

        Args:
            backend: A name of :data:`BACKENDS`, or ``"auto"`` for the first available of
                :data:`DEFAULT_ORDER`.
            limits: Resource limits of every run (defaults: :class:`Limits`).
            proxy_socket: Host path of the filtering proxy's unix socket; the only network path
                out of the sandbox. ``None`` means no network.

        Raises:
            ValueError: Unknown backend name.
            SandboxError: The backend does not work on this machine (the message says how to fix).
        """
        self.limits = limits if limits is not None else Limits()
        if not isinstance(self.limits, Limits):
            raise TypeError(f"limits must be arborl.sandbox.Limits, got {type(self.limits).__name__}")
        if backend == "auto":
            available = self.available_backends()
            backend = next((b for b in DEFAULT_ORDER if b in available), "")
            if not backend:
                reasons = "; ".join(f"{n}: {probe_backend(n)}" for n in DEFAULT_ORDER)
                raise SandboxError(f"no sandbox backend works on this machine ({reasons})")
        cls = backend_class(backend)
        reason = probe_backend(backend)
        if reason is not None:
            raise SandboxError(f"sandbox backend {backend!r} is not available: {reason}")
        self.backend_name = backend
        self._backend: Backend = cls(self.limits, proxy_socket=proxy_socket)
        self._closed = False

    @staticmethod
    def available_backends() -> list[str]:
        """Names of the backends whose ``probe()`` says they work on this machine."""
        return [name for name in BACKENDS if probe_backend(name) is None]

    def run_python(self, code: str, *, stdin: str = "", files: dict[str, bytes] | None = None) -> ExecResult:
        """Run a snippet from a clean scratch directory.

        Args:
            code: Python source, run as ``__main__``.
            stdin: Text served on standard input.
            files: ``{relative path: bytes}`` placed in the scratch directory before the run.

        Returns:
            The :class:`ExecResult`; timeouts, crashes and limits are fields, not exceptions.

        Raises:
            SandboxError: The sandbox itself failed, or the sandbox was closed.
        """
        if self._closed:
            raise SandboxError("this Sandbox is closed; create a new one")
        return self._backend.run_python(code, stdin=stdin, files=files)

    async def arun_python(
        self, code: str, *, stdin: str = "", files: dict[str, bytes] | None = None
    ) -> ExecResult:
        """:meth:`run_python` in a worker thread, for asyncio callers."""
        return await asyncio.to_thread(self.run_python, code, stdin=stdin, files=files)

    def close(self) -> None:
        """Release the backend's resources (warm processes, containers); idempotent."""
        if not self._closed:
            self._closed = True
            self._backend.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

"""The ``python`` tool for agents, and a reward-hack-resistant scorer for code solutions.

:class:`PythonTool` runs a snippet in the configured :class:`~arborl.sandbox.Sandbox` and
returns its stdout/stderr as the tool result, truncated with a visible marker. Sandbox failures
and timeouts become result text, never exceptions.

:func:`score_solution` scores a solution against hidden test cases. What it defends against
(the reward hacks seen in code RL, see ``docs/sandbox.md``):

- **Expected values never enter the sandbox.** Each case runs the solution and reports the
  *actual* value (or stdout); the comparison with the expected value happens here, in the
  caller. Reading files, memory or frames in the sandbox cannot reveal what would pass.
- **Tests are not files the solution can edit.** The harness is generated here and passed as the
  snippet; the solution is only ``solution.py`` in the scratch dir. Adding ``conftest.py`` or
  editing "test files" changes nothing.
- **Every expected case must report, exactly once, through the harness channel.** Each case is
  a separate sandbox run whose harness prints one record tagged with a fresh random nonce after
  the solution returned. Early ``exit(0)`` / ``os._exit(0)``, a crash, a syntax error that stops
  the import, or a timeout leave the record missing, and a missing record is a failure (unlike
  "missing tests count as passing"). Duplicated or malformed records also fail the case.
- **All or nothing.** The score is 1.0 only if every case passed, else 0.0.
"""

from __future__ import annotations

import ast
import json
import secrets
from dataclasses import dataclass, field
from typing import Any, ClassVar

from arborl.sandbox import ExecResult, Sandbox, SandboxError
from arborl.tools.base import truncate

DEFAULT_MAX_CHARS = 16_000


def format_result(res: ExecResult, *, wall_s: float, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """Render an :class:`ExecResult` as the text an agent sees."""
    parts: list[str] = []
    if res.stdout:
        parts.append(res.stdout)
    if res.stderr:
        parts.append(("[stderr]\n" if res.stdout else "") + res.stderr)
    if res.output_truncated:
        parts.append("...[truncated: output exceeded the sandbox's output limit]")
    if res.error:
        parts.append(f"SandboxError: {res.error}")
    if res.timed_out:
        parts.append(f"TimeoutError: killed after {wall_s:g} s")
    elif res.memory_exceeded:
        parts.append("MemoryError: killed at the sandbox memory limit")
    elif res.exit_code not in (0, None) and not res.stderr:
        parts.append(f"[exit code {res.exit_code}]")
    text = "\n".join(p.rstrip("\n") for p in parts)
    return truncate(text, max_chars) if text else "[no output]"


class PythonTool:
    """Run Python code in a sandbox; the result text is its stdout/stderr.

    Args:
        sandbox: The sandbox that runs every call (the tool does not close it).
        max_chars: Result text beyond this many characters is cut with a marker.
    """

    name: ClassVar[str] = "python"
    description: ClassVar[str] = (
        "Run a Python 3 program in an isolated sandbox and return what it prints. Each call starts "
        "fresh: no files, variables or processes survive between calls. There is no network access "
        "unless a proxy is configured. Print the values you need."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python source code to run."}},
        "required": ["code"],
        "additionalProperties": False,
    }

    def __init__(self, sandbox: Sandbox, *, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.sandbox = sandbox
        self.max_chars = max_chars

    def __call__(self, arguments: dict[str, Any]) -> str:
        """Run ``arguments["code"]``; malformed arguments become an error text."""
        if not isinstance(arguments, dict) or not isinstance(arguments.get("code"), str):
            got = sorted(arguments) if isinstance(arguments, dict) else type(arguments).__name__
            return f'ArgumentError: expected {{"code": "<python source>"}}, got {got}'
        return self.run(arguments["code"])

    def run(self, code: str) -> str:
        """Run one snippet and return the result text (never raises for sandbox problems)."""
        try:
            res = self.sandbox.run_python(code)
        except (SandboxError, OSError, ValueError, TypeError) as exc:
            return f"SandboxError: {exc}"
        return format_result(res, wall_s=self.sandbox.limits.wall_s, max_chars=self.max_chars)


@dataclass(frozen=True)
class TestCase:
    """One hidden test case, in one of two styles.

    Attributes:
        name: Shown in the per-case results.
        call: Function style: an expression evaluated in the solution module, e.g. ``"add(1, 2)"``;
            its value must equal ``expected`` (compared by the caller, after ``ast.literal_eval``).
        expected: The value ``call`` must produce (a Python literal: numbers, str, list, dict...).
        stdin: Program style: the solution runs as ``__main__`` with this standard input...
        expected_stdout: ...and must print exactly this (trailing whitespace per line ignored).
    """

    __test__: ClassVar[bool] = False  # not a pytest test class

    name: str
    call: str | None = None
    expected: Any = None
    stdin: str | None = None
    expected_stdout: str | None = None

    def __post_init__(self) -> None:
        if (self.call is None) == (self.expected_stdout is None):
            raise ValueError(
                f"TestCase {self.name!r}: give either call= (with expected=) or stdin=/expected_stdout=, not both"
            )
        if self.call is not None:
            ast.parse(self.call, mode="eval")  # a broken hidden test is the author's error, say so now


@dataclass
class CaseResult:
    """Outcome of one case: ``passed`` and a short human-readable reason."""

    name: str
    passed: bool
    detail: str


@dataclass
class JudgeResult:
    """Outcome of :func:`score_solution`.

    Attributes:
        score: 1.0 if every expected case passed, else 0.0.
        passed: Number of cases that passed.
        total: Number of cases expected (the length of the hidden test list).
        cases: Per-case results, in order.
    """

    score: float
    passed: int
    total: int
    cases: list[CaseResult] = field(default_factory=list)


# The harness runs in the sandbox as __main__; the solution is solution.py in the scratch dir (the cwd). It prints exactly
# one record line, tagged with the nonce, after the solution returned. {nonce}/{call} are filled
# in by _harness(); the record carries the actual value only, never a verdict.
_FUNCTION_HARNESS = """\
import importlib.util as _u, json as _j, os as _os, sys as _s
_spec = _u.spec_from_file_location("solution", _os.path.abspath("solution.py"))
_mod = _u.module_from_spec(_spec)
_s.modules["solution"] = _mod
_spec.loader.exec_module(_mod)
_value = eval({call!r}, vars(_mod))
_s.stdout.flush()
print("\\n" + {nonce!r} + " " + _j.dumps({{"repr": repr(_value)}}), flush=True)
"""
_PROGRAM_HARNESS = """\
import runpy as _r, json as _j, os as _os, sys as _s
_p = _os.path.abspath("solution.py")
_status = 0
try:
    _r.run_path(_p, run_name="__main__")
except SystemExit as _e:
    _status = _e.code if isinstance(_e.code, int) else (0 if _e.code is None else 1)
_s.stdout.flush()
print("\\n" + {nonce!r} + " " + _j.dumps({{"status": _status}}), flush=True)
"""


def _harness(case: TestCase, nonce: str) -> str:
    template = _FUNCTION_HARNESS if case.call is not None else _PROGRAM_HARNESS
    return template.format(call=case.call, nonce=nonce)


def _record(res: ExecResult, nonce: str) -> tuple[dict | None, str, str]:
    """Find the single harness record; return (record, stdout without it, failure reason)."""
    lines = res.stdout.split("\n")
    hits = [i for i, line in enumerate(lines) if line.startswith(nonce + " ")]
    if len(hits) != 1:
        why = (
            "no harness record (the run ended early or crashed)" if not hits else "duplicated harness record"
        )
        return None, "", why
    try:
        record = json.loads(lines[hits[0]][len(nonce) + 1 :])
    except ValueError:
        return None, "", "malformed harness record"
    # The harness prints a newline before the record; drop it with the record line.
    body = lines[: hits[0]]
    if body and body[-1] == "":
        body = body[:-1]
    return record, "\n".join(body), ""


def _judge(case: TestCase, res: ExecResult, nonce: str) -> CaseResult:
    if res.timed_out or res.memory_exceeded or res.output_truncated or res.error:
        why = "timed out" if res.timed_out else "memory limit" if res.memory_exceeded else "output limit"
        return CaseResult(case.name, False, res.error or why)
    if res.exit_code != 0:
        tail = res.stderr.strip().splitlines()[-1:] or [f"exit code {res.exit_code}"]
        return CaseResult(case.name, False, tail[0][:200])
    record, body, why = _record(res, nonce)
    if record is None:
        return CaseResult(case.name, False, why)
    if case.call is not None:
        try:
            actual = ast.literal_eval(record["repr"])
        except (KeyError, ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return CaseResult(case.name, False, "result is not a Python literal")
        ok = actual == case.expected and type(actual) is type(case.expected)
        return CaseResult(case.name, ok, "ok" if ok else f"got {record['repr'][:100]}")
    if record.get("status") != 0:
        return CaseResult(case.name, False, f"exit status {record.get('status')!r}")
    want = [ln.rstrip() for ln in (case.expected_stdout or "").rstrip("\n").split("\n")]
    got = [ln.rstrip() for ln in body.rstrip("\n").split("\n")]
    ok = want == got
    return CaseResult(case.name, ok, "ok" if ok else "wrong output")


def score_solution(sandbox: Sandbox, solution_code: str, tests: list[TestCase]) -> JudgeResult:
    """Score ``solution_code`` on hidden ``tests``: 1.0 only if every case passes.

    Each case is one sandbox run from a clean scratch directory holding only ``solution.py``.
    See the module docstring for what this defends against.

    Args:
        sandbox: Where the solution runs.
        solution_code: The candidate's Python source.
        tests: The hidden cases; their expected values stay in this process.

    Returns:
        The score, the counts and per-case reasons.

    Raises:
        ValueError: ``tests`` is empty (a judge with no cases must not hand out reward).
    """
    if not tests:
        raise ValueError(
            "score_solution needs at least one TestCase; an empty suite would score anything 1.0"
        )
    files = {"solution.py": solution_code.encode()}
    cases: list[CaseResult] = []
    for case in tests:
        nonce = "ARBORL-" + secrets.token_hex(16)
        try:
            res = sandbox.run_python(_harness(case, nonce), stdin=case.stdin or "", files=files)
        except SandboxError as exc:
            cases.append(CaseResult(case.name, False, f"sandbox error: {exc}"))
            continue
        cases.append(_judge(case, res, nonce))
    passed = sum(c.passed for c in cases)
    return JudgeResult(
        score=1.0 if passed == len(tests) else 0.0, passed=passed, total=len(tests), cases=cases
    )

"""The python tool's text contract and the judge's bookkeeping (sandbox probes live in tests/sandbox)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from arborl.sandbox import ExecResult, Limits, Sandbox
from arborl.tools.base import Tool
from arborl.tools.python_tool import PythonTool, TestCase, format_result, score_solution, truncate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))
from sbutil import require_backend  # noqa: E402


def res(**kw: object) -> ExecResult:
    base: dict[str, object] = {"ok": True, "exit_code": 0, "stdout": "", "stderr": ""}
    base.update(kw)
    return ExecResult(**base)  # type: ignore[arg-type]


def test_truncate_marks_the_dropped_byte_count() -> None:
    assert truncate("abc", 3) == "abc"
    assert truncate("abcdef", 4) == "abcd\n...[truncated 2 bytes]"
    assert truncate("ab\u00e9\u00e9", 2) == "ab\n...[truncated 4 bytes]"  # two 2-byte characters


def test_format_result_text_forms() -> None:
    assert format_result(res(stdout="1\n"), wall_s=5) == "1"
    assert format_result(res(), wall_s=5) == "[no output]"
    assert format_result(res(stdout="a\n", stderr="b\n", exit_code=1, ok=False), wall_s=5) == "a\n[stderr]\nb"
    assert format_result(res(exit_code=3, ok=False), wall_s=5) == "[exit code 3]"
    assert (
        format_result(res(timed_out=True, ok=False, exit_code=-9), wall_s=2.5)
        == "TimeoutError: killed after 2.5 s"
    )
    text = format_result(res(memory_exceeded=True, ok=False, exit_code=-9), wall_s=5)
    assert text == "MemoryError: killed at the sandbox memory limit"
    long = format_result(res(stdout="x" * 50, output_truncated=True), wall_s=5, max_chars=10)
    assert long.startswith("x" * 10 + "\n...[truncated ") and long.endswith(" bytes]")


def test_tool_schema_and_protocol() -> None:
    assert PythonTool.name == "python"
    assert PythonTool.parameters["required"] == ["code"]
    assert PythonTool.parameters["properties"]["code"]["type"] == "string"


class FailingSandbox:
    """Stands in for a sandbox whose backend broke mid-episode (a real SandboxError path)."""

    limits = Limits()

    def run_python(self, code: str, **kwargs: object) -> ExecResult:
        from arborl.sandbox import SandboxError

        raise SandboxError("backend went away")


def test_tool_turns_bad_arguments_and_sandbox_errors_into_text() -> None:
    tool = PythonTool(FailingSandbox())  # type: ignore[arg-type]
    assert isinstance(tool, Tool)
    assert tool({"cmd": "x"}).startswith('ArgumentError: expected {"code"')
    assert tool("print(1)").startswith("ArgumentError")  # type: ignore[arg-type]
    assert tool({"code": "print(1)"}) == "SandboxError: backend went away"


def test_testcase_validation() -> None:
    with pytest.raises(ValueError, match="either call="):
        TestCase("both", call="f()", expected=1, expected_stdout="1")
    with pytest.raises(ValueError, match="either call="):
        TestCase("neither")
    with pytest.raises(SyntaxError):
        TestCase("broken", call="f(", expected=1)


def test_empty_suite_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one TestCase"):
        score_solution(FailingSandbox(), "x = 1", [])  # type: ignore[arg-type]


def test_sandbox_errors_score_zero() -> None:
    out = score_solution(
        FailingSandbox(), "def f():\n    return 1\n", [TestCase("t", call="f()", expected=1)]
    )  # type: ignore[arg-type]
    assert (out.score, out.passed, out.total) == (0.0, 0, 1)
    assert out.cases[0].detail == "sandbox error: backend went away"


@pytest.fixture(scope="module")
def real_sandbox() -> Sandbox:
    name = "bwrap"
    require_backend(name)
    sb = Sandbox(name, Limits(wall_s=2.0, cpu_s=2.0, memory_mb=128, pids=16, disk_mb=8, output_bytes=4096))
    yield sb
    sb.close()


def test_tool_runs_code_in_the_sandbox(real_sandbox: Sandbox) -> None:
    tool = PythonTool(real_sandbox, max_chars=300)
    assert tool({"code": "print(6 * 7)"}) == "42"
    assert tool({"code": "import os\nprint(os.getuid())"}) == "65534"
    text = tool({"code": "raise KeyError('k')"})
    assert text.startswith("Traceback") and text.endswith("KeyError: 'k'")
    assert tool({"code": "import time\ntime.sleep(10)"}) == "TimeoutError: killed after 2 s"
    flood = tool({"code": "print('z' * 100000)"})
    assert flood.startswith("z" * 300 + "\n...[truncated ") and flood.endswith(" bytes]")
    assert os.environ.get("ARBORL_TEST_SECRET", "") not in tool(
        {"code": "import os\nprint(dict(os.environ))"}
    )


def test_program_style_comparison_ignores_trailing_whitespace(real_sandbox: Sandbox) -> None:
    cases = [TestCase("t", stdin="3\n", expected_stdout="9\n")]
    assert score_solution(real_sandbox, "n = int(input())\nprint(n * n, ' ')\n", cases).score == 1.0
    assert score_solution(real_sandbox, "n = int(input())\nprint(n * n + 1)\n", cases).score == 0.0


def test_function_style_compares_types(real_sandbox: Sandbox) -> None:
    cases = [TestCase("t", call="half(3)", expected=1.5)]
    assert score_solution(real_sandbox, "def half(x):\n    return x / 2\n", cases).score == 1.0
    assert score_solution(real_sandbox, "def half(x):\n    return '1.5'\n", cases).score == 0.0

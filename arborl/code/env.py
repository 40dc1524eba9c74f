"""The code-agent task: write or fix a function, run it on the visible tests, submit; hidden tests judge.

``code_env(**kwargs)`` (the recipe's ``env.cls = "arborl.code.env:code_env"``) returns a
:class:`~arborl.env.tool_env.ToolEnv` composed of

* a **task source**: seed -> problem. Seeds below ``heldout_from`` are training problems, the
  others held out (disjoint keys, see :mod:`arborl.code.problems`); generated from the seed, or
  read from ``train_file`` / ``test_file`` (:mod:`arborl.code.data`);
* one **tool**, ``python`` (:class:`VisibleTestRunner`): it runs the model's code in the sandbox
  and then the problem's visible tests against it, and returns what the code printed, each
  failing test and a last line ``visible tests : P / N passed``. Each call starts fresh;
* a **reward**: the submitted ``<answer>`` code scored on the hidden tests by
  :func:`~arborl.tools.python_tool.score_solution` in the same sandbox backend: 1 only if every
  hidden test passes.

The multi-turn loop is the tool env's: the model calls ``python`` as often as it likes within
``max_steps`` turns, reads the results, revises and submits. Episode metrics (the last turn's
``info["metrics"]``, averaged by the evaluation and RL rows): ``pass_rate`` (hidden tests passed
by the submission; 0 without one), ``tool_calls``, ``fixed_failing`` (1 when a failed run was
later followed by a run that passed every visible test), ``sandbox_timeouts`` and ``submitted``.

**Sandbox backend** (``sandbox``): a name of :data:`arborl.sandbox.BACKENDS`, or ``"auto"``,
:func:`choose_backend`: the first backend of :data:`FAST_ORDER` whose probe passes here. The
order is by the measured p50 latency of a run in ``docs/sandbox.md`` (zygote 3.8 ms, bwrap
17.5 ms, wasm 89 ms, docker 177 ms), and holds only backends with "yes" in every row of its
threat-model table; ``process`` is left out (it sees the host tree). One sandbox per backend is
shared by every env of the process (:func:`arborl.tools.services.shared_service`), since env
steps run concurrently on ``rollout.env_workers`` threads and a sandbox serves concurrent runs.

**Oracle** (the expert ``synth`` replays): submit the reference solution once a run passed every
visible test, else run it; on a bug-fix problem it first runs the given buggy code (the failing
test shows), then the fix, then submits the fix. It reads the episode so far, so it also finishes
an episode another policy began (a failed or timed-out run is followed by the passing one).
With ``oracle_error = p`` it is an **imperfect teacher**: on a stable share ``p`` of the bug-fix
problems (a hash of the problem id) it trusts the code it was handed and submits it untested, a
wrong answer. A policy that imitates it submits bug reports untested; RL has to discover that
running the code first, and fixing what fails, is what scores (``submitted_untested`` counts it).

``env.random_action(rng)`` is a well-formed ``python`` call of the current function with a body
and parameter drawn from its family (mostly wrong, run for real): mid-training's noisy synthesis
(:func:`arborl.train.midtrain.noisy_expert`) mixes it into the expert's episodes.
"""

from __future__ import annotations

import functools
import json
import random
import re
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from arborl.code.data import read_jsonl
from arborl.code.problems import FAMILIES, Problem, family_words, generate_problem
from arborl.config import ConfigError
from arborl.env import split
from arborl.env.tool_env import Task, ToolEnv
from arborl.sandbox import BACKENDS, Limits, Sandbox, SandboxError
from arborl.sandbox.core import probe_backend
from arborl.tools.formats import hermes_format
from arborl.tools.python_tool import TestCase, format_result, score_solution
from arborl.tools.services import shared_service

FAST_ORDER = ("zygote", "bwrap", "wasm", "docker")
"""Backends that pass the whole threat suite, fastest first (see the module docstring)."""
INSTRUCTIONS = "Write the Python function . Test it with python . Submit the code in <answer> </answer> ."
_STATUS = re.compile(r"^visible tests : (\d+) / (\d+) passed$", re.M)

# Runs in the sandbox: the model's code, then each visible test against it. Expected values of
# visible tests are shown to the model anyway; hidden ones never enter this harness.
_HARNESS = """\
import contextlib as _c, io as _io, sys as _s
_src = {code!r}
_g = {{"__name__": "solution"}}
if {load!r}:
    try:
        exec(compile(_src, "solution.py", "exec"), _g)
    except BaseException as _e:
        print("error in the code :", type(_e).__name__, ":", str(_e)[:200])
_ok = 0
for _i, (_call, _want, _stdin, _out) in enumerate({tests!r}, 1):
    try:
        if _call is not None:
            _got = eval(_call, _g)
            _pass, _shown = _got == _want and type(_got) is type(_want), repr(_got)
        else:
            _buf = _io.StringIO()
            _s.stdin = _io.StringIO(_stdin)
            with _c.redirect_stdout(_buf):
                try:
                    exec(compile(_src, "solution.py", "exec"), {{"__name__": "__main__"}})
                except SystemExit:
                    pass
            _norm = lambda t: [ln.rstrip() for ln in t.rstrip("\\n").split("\\n")]
            _pass, _shown = _norm(_buf.getvalue()) == _norm(_out), repr(_buf.getvalue()[:100])
    except BaseException as _e:
        _pass, _shown = False, type(_e).__name__ + ": " + str(_e)[:100]
    _ok += bool(_pass)
    if not _pass:
        print("test", _i, "failed :", _call if _call is not None else "stdin " + repr(_stdin[:60]),
              "gave", _shown[:120], "expected", repr(_want if _call is not None else _out)[:120])
print("visible tests :", _ok, "/", {n}, "passed")
"""


def choose_backend(name: str = "auto") -> str:
    """The sandbox backend to use: ``name`` itself, or for ``"auto"`` the fastest that works here.

    Raises:
        ConfigError: ``name`` is unknown, or ``"auto"`` finds none of :data:`FAST_ORDER` working.
    """
    if name != "auto":
        if name not in BACKENDS:
            raise ConfigError(f"env.kwargs.sandbox = {name!r}; choose 'auto' or one of {sorted(BACKENDS)}")
        return name
    reasons = {}
    for candidate in FAST_ORDER:
        reason = probe_backend(candidate)
        if reason is None:
            return candidate
        reasons[candidate] = reason
    raise ConfigError(f"env.kwargs.sandbox = 'auto' found no working backend ({reasons}); install bubblewrap "
                      "(scripts/setup) or name one explicitly")


def shared_sandbox(backend: str, wall_s: float) -> Sandbox:
    """The process's sandbox of ``backend`` with a ``wall_s`` deadline per run (started on first use)."""
    return shared_service(("code-sandbox", backend, wall_s), start=lambda: Sandbox(backend, Limits(wall_s=wall_s)),
                          stop=Sandbox.close)


def harness(code: str, tests: Sequence[TestCase], *, load: bool = True) -> str:
    """The sandbox program that runs ``code`` and then ``tests`` on it (see :class:`VisibleTestRunner`)."""
    rows = [(t.call, t.expected, t.stdin, t.expected_stdout) for t in tests]
    code = normalize_code(code)
    return _HARNESS.format(code=code, load=load, tests=rows, n=len(rows))


class VisibleTestRunner:
    """The ``python`` tool of the code task: run the code, then the current problem's visible tests.

    Args:
        sandbox: Returns the sandbox to run in (called per run; the shared one by default).
        problem: Returns the current episode's problem.
    """

    name: ClassVar[str] = "python"
    description: ClassVar[str] = "Run Python code , then the visible tests on it ; returns the output ."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object", "properties": {"code": {"type": "string", "description": "Python source code"}},
        "required": ["code"], "additionalProperties": False}

    def __init__(self, sandbox: Callable[[], Sandbox], problem: Callable[[], Problem]) -> None:
        self.sandbox, self.problem = sandbox, problem

    def __call__(self, arguments: dict[str, Any]) -> str:
        """Run ``arguments["code"]`` and the visible tests; sandbox failures become result text."""
        pr = self.problem()
        sb = self.sandbox()
        try:
            res = sb.run_python(harness(arguments["code"], pr.visible, load=bool(pr.entry_point)))
        except (SandboxError, OSError, ValueError) as exc:
            return f"SandboxError: {exc}"
        return format_result(res, wall_s=sb.limits.wall_s)


def normalize_code(code: str) -> str:
    """Code without the indent of a call's or answer's framing (``" def f ( x ) : ..."``, a block indented as a whole)."""
    code = textwrap.dedent(code.strip("\n"))
    return code.lstrip(" \t") if code[:1] in (" ", "\t") else code  # a first line indented more than the rest


def run_passed(result: str) -> bool:
    """Whether a ``python`` result reports every visible test passed (no status line: a failed run)."""
    found = _STATUS.findall(result)
    return bool(found) and found[-1][0] == found[-1][1] and "TimeoutError: killed" not in result


def strip_fences(answer: str) -> str:
    """The code of an answer, without a surrounding Markdown code fence (and normalised as :func:`normalize_code`)."""
    text = answer.strip()
    m = re.fullmatch(r"```[a-zA-Z0-9]*\s*\n?(.*?)\n?```", text, re.S)
    return normalize_code(m.group(1) if m else text)


def python_call(code: str) -> str:
    """The Hermes call text of one ``python`` call (spaces around the JSON, so each part is a word)."""
    return "<tool_call> " + json.dumps({"name": "python", "arguments": {"code": f" {code} "}}) + " </tool_call>"


def task_text(pr: Problem) -> str:
    """The user message: the spec, the signature or the buggy function, and the visible tests."""
    code = pr.buggy_code if pr.kind == "bugfix" else pr.signature
    tests = " ; ".join(f"assert {t.call} == {t.expected!r}" if t.call is not None else
                       f"input {t.stdin!r} prints {t.expected_stdout!r}" for t in pr.visible)
    return "\n".join(p for p in (pr.prompt, code, f"Visible tests : {tests}") if p)


class CodeTasks:
    """Seed -> task, and the reward, metrics and oracle of one env (each env has its own).

    Args:
        problem: Seed -> :class:`Problem`.
        sandbox: Returns the judge's sandbox.
    """

    def __init__(self, problem: Callable[[int], Problem], sandbox: Callable[[], Sandbox],
                 oracle_error: float = 0.0) -> None:
        self.problem, self.sandbox, self.oracle_error = problem, sandbox, oracle_error
        self.current: Problem | None = None
        self.judged: tuple[int, int] | None = None

    def __call__(self, seed: int) -> Task:
        """The task of ``seed`` (and it becomes the current problem)."""
        self.current, self.judged = self.problem(seed), None
        return Task(task_text(self.current), answer=None, id=self.current.id)

    def get(self) -> Problem:
        """The current problem."""
        if self.current is None:
            raise RuntimeError("code env: call reset() before running code")
        return self.current

    def reward(self, answer: str, task: Task) -> float:
        """1.0 only if the submitted code passes every hidden test in the sandbox."""
        result = score_solution(self.sandbox(), strip_fences(answer), list(self.get().hidden))
        self.judged = (result.passed, result.total)
        return result.score

    def metrics(self, env: ToolEnv, answer: str | None) -> dict[str, float]:
        """``pass_rate``, ``tool_calls``, ``fixed_failing``, ``sandbox_timeouts``, ``submitted``, ``submitted_untested``."""
        runs = [result for name, _, result in env.calls if name == "python"]
        passed = [run_passed(r) for r in runs]
        fixed = any(not a and any(passed[i + 1:]) for i, a in enumerate(passed))
        rate = self.judged[0] / self.judged[1] if answer is not None and self.judged else 0.0
        return {"pass_rate": rate, "tool_calls": float(len(runs)), "fixed_failing": float(fixed),
                "sandbox_timeouts": float(sum("TimeoutError: killed" in r for r in runs)),
                "submitted": float(answer is not None), "submitted_untested": float(answer is not None and not runs)}

    def slips(self, pr: Problem) -> bool:
        """Whether the imperfect teacher submits ``pr``'s given code untested (a stable share of bug fixes)."""
        return pr.kind == "bugfix" and split.stable_unit(f"oracle-{pr.id}") < self.oracle_error

    def random_action(self, rng: random.Random) -> str:
        """A well-formed ``python`` call with plausible, mostly wrong code (mid-training's noisy synthesis).

        The current function with a return expression drawn from its family's reference and
        planted bugs and a parameter drawn from the family's values; the sandbox runs it for real.
        A user's problem, with no family, gets its given buggy code or the reference.
        """
        pr = self.get()
        fam = _FAMILY.get(pr.entry_point)
        if fam is None or pr.signature != f"def {fam.name} ( {fam.arg} ) :":
            return python_call(rng.choice([c for c in (pr.buggy_code, pr.solution) if c] or [f"{pr.signature} pass"]))
        return python_call(fam.code(rng.choice((fam.body, *fam.bugs)), rng.choice(fam.params)))

    def expert(self, env: ToolEnv) -> str:
        """The oracle's next action (see the module docstring)."""
        pr = self.get()
        if not pr.solution:
            raise ConfigError(f"problem {pr.id!r} has no 'solution'; the oracle needs one for synth")
        runs = [result for name, _, result in env.calls if name == "python"]
        if not runs and self.slips(pr):
            return f"<answer> {pr.buggy_code} </answer>"
        if runs and run_passed(runs[-1]):
            return f"<answer> {pr.solution} </answer>"
        first_look = pr.kind == "bugfix" and not runs  # a bug report: run the given code, see the failure
        return python_call(pr.buggy_code if first_look else pr.solution)


_FAMILY = {fam.name: fam for fam in FAMILIES}


@functools.lru_cache(maxsize=8)
def _file(path: str) -> tuple[Problem, ...]:
    return tuple(read_jsonl(path))


def code_env(*, train_file: str = "", test_file: str = "", heldout_from: int = 1_000_000_000,
             test_frac: float = 0.2, bugfix_frac: float = 0.5, sandbox: str = "auto", wall_s: float = 5.0,
             max_steps: int = 6, tool_prompt: str = "compact", instructions: str = "system",
             oracle_error: float = 0.0) -> ToolEnv:
    """The code-agent :class:`~arborl.env.tool_env.ToolEnv` (see the module docstring).

    Args:
        train_file: JSONL of training problems (default: generated from the seed).
        test_file: JSONL of held-out problems (default: generated).
        heldout_from: Seeds from here on are held-out problems (= the recipe's ``env.eval_seed_start``).
        test_frac: Share of generated problem keys held out.
        bugfix_frac: Share of generated problems that are bug fixes.
        sandbox: A backend name, or ``"auto"`` (:func:`choose_backend`).
        wall_s: Wall-clock limit of one sandbox run (a visible-test run, or one hidden test).
        max_steps: Turns per episode (runs and the submission).
        tool_prompt: ``"compact"`` (one line per tool, for a small policy) or ``"hermes"`` (JSON schemas).
        instructions: Where the tool instructions go, ``"system"`` or ``"user"``.
        oracle_error: The expert (``synth``) as an imperfect teacher: on this share of the bug-fix
            problems (a stable hash of the problem id) it submits the given buggy code untested.

    Raises:
        ConfigError: An unknown backend or prompt style, or a share out of range.
        SchemaError: A problems file is missing or malformed.
    """
    if not 0 <= oracle_error <= 1:
        raise ConfigError(f"env.kwargs.oracle_error = {oracle_error}; give a share in [0, 1] of the bug-fix problems")
    if not 0 < test_frac < 1 or not 0 <= bugfix_frac <= 1:
        raise ConfigError(f"env.kwargs: test_frac = {test_frac} must be in (0, 1) and bugfix_frac = {bugfix_frac} "
                          "in [0, 1]")
    backend = choose_backend(sandbox)
    train = _file(train_file) if train_file else None
    test = _file(test_file) if test_file else None

    def problem(seed: int) -> Problem:
        held = seed >= heldout_from
        pool, k = (test, seed - heldout_from) if held else (train, seed)
        if pool:
            return pool[k % len(pool)]
        return generate_problem(k, test=held, test_frac=test_frac, bugfix_frac=bugfix_frac)

    def box() -> Sandbox:
        return shared_sandbox(backend, wall_s)

    source = CodeTasks(problem, box, oracle_error)
    runner = VisibleTestRunner(box, source.get)
    env = ToolEnv(source, [runner], source.reward, call_format=hermes_format(tool_prompt),
                  max_steps=max_steps, call_timeout_s=wall_s + 10.0, system_prompt=INSTRUCTIONS,
                  instructions=instructions, task_type="code", expert=source.expert, metrics=source.metrics,
                  deterministic=oracle_error == 0)  # an imperfect expert is not checked for success
    env.vocabulary = tuple(family_words()) + ("visible", "tests", ":", "/", "passed", "<answer>",  # type: ignore[attr-defined]
                                              "</answer>", "<tool_call>", "</tool_call>", '{"name":', '"python",',
                                              '"arguments":', '{"code":', '"', '"}}')
    env.sandbox_backend = backend  # type: ignore[attr-defined]
    env.random_action = source.random_action  # type: ignore[attr-defined]
    return env

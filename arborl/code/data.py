"""The JSONL format of code problems: arborl's own, and the DeepCoder / LiveCodeBench test formats.

One problem a line. arborl's fields (what :func:`write_jsonl` writes)::

    {"id": "code-train-7", "prompt": "Return a list of every element of xs multiplied by 3 .",
     "entry_point": "scale", "signature": "def scale ( xs ) :", "kind": "synth",
     "visible_tests": [{"call": "scale([1, 2])", "expected": [3, 6]}],
     "hidden_tests": [{"call": "scale([1, 2])", "expected": [3, 6]}, {"call": "scale([])", "expected": []}],
     "solution": "def scale ( xs ) : return [ x * 3 for x in xs ]", "buggy_code": "", "split": "train"}

Required: ``prompt`` (or ``question`` / ``question_content`` / ``problem``) and at least one hidden
test. A test is one of

* **function call**: ``{"call": "f(1, 2)", "expected": 3}`` (``expected`` a JSON value; compared
  with ``==`` and the same type after the call's value is read back as a Python literal);
* **stdin/stdout**: ``{"input": "1 2\\n", "output": "3\\n"}``: the program reads ``input`` and
  must print ``output`` (trailing whitespace of each line ignored);
* **LiveCodeBench functional**: ``{"input": "[1, 2]\\n3", "output": "[3, 6]", "testtype": "functional"}``:
  one JSON argument per input line, the JSON return value as output; the function is the
  problem's ``entry_point`` (or ``metadata.func_name``, LiveCodeBench's field).

Where the tests come from, in order: ``visible_tests`` / ``hidden_tests``; LiveCodeBench's
``public_test_cases`` (visible) and ``private_test_cases`` (hidden; the public ones are added to
the hidden ones); DeepCoder's ``tests``, a list of the tests above or the APPS/TACO object
``{"inputs": [...], "outputs": [...], "fn_name": "f"}`` (with ``fn_name``: ``inputs[i]`` is the
argument list and ``outputs[i]`` the return value; without: stdin/stdout strings). Any of these
may be a JSON-encoded string, as the published datasets store them. Without visible tests, the
first ``n_visible`` hidden ones are shown.

``kind = "bugfix"`` needs ``buggy_code`` (shown to the model). ``solution`` is needed only for
synthetic demonstrations (the oracle submits it). ``split`` (``train`` / ``test``) is optional:
lines without it are split by a hash of their id.

    python -m arborl.code.data OUT_DIR [--n 500]    # the generated problems as train.jsonl and test.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from arborl.code.problems import Problem, generate_problem
from arborl.tools.python_tool import TestCase
from arborl.trajectory.schema import SchemaError

_PROMPT_FIELDS = ("prompt", "question", "question_content", "problem")


def _decoded(value: Any) -> Any:
    """A field the published datasets store as a JSON string, decoded (other values as they are)."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        return json.loads(value)
    return value


def _function_call(entry: str, args: list[Any]) -> str:
    return f"{entry}({', '.join(repr(a) for a in args)})"


def _test(obj: Any, i: int, entry: str, tag: str) -> TestCase:
    """One test of any accepted style (see the module docstring)."""
    name = f"{tag}{i}"
    if not isinstance(obj, dict):
        raise ValueError(f"test {i} is {type(obj).__name__}; give an object with call/expected or input/output")
    if "call" in obj:
        if "expected" not in obj:
            raise ValueError(f"test {i} has 'call' but no 'expected'")
        return TestCase(name, call=str(obj["call"]), expected=obj["expected"])
    if "input" not in obj or "output" not in obj:
        raise ValueError(f"test {i} needs 'call' and 'expected', or 'input' and 'output' (has {sorted(obj)})")
    if obj.get("testtype") == "functional":
        if not entry:
            raise ValueError(f"test {i} is functional but the problem names no entry_point (or metadata.func_name)")
        args = [json.loads(line) for line in str(obj["input"]).split("\n") if line.strip()]
        return TestCase(name, call=_function_call(entry, args), expected=json.loads(str(obj["output"])))
    return TestCase(name, stdin=str(obj["input"]), expected_stdout=str(obj["output"]))


def _tests(value: Any, entry: str, tag: str) -> list[TestCase]:
    value = _decoded(value)
    if isinstance(value, dict) and "inputs" in value:  # APPS / TACO, as DeepCoder ships them
        fn = value.get("fn_name") or entry
        pairs = zip(value["inputs"], value.get("outputs", []), strict=True)
        if value.get("fn_name"):
            return [TestCase(f"{tag}{i}", call=_function_call(fn, list(a)), expected=o) for i, (a, o) in enumerate(pairs)]
        return [TestCase(f"{tag}{i}", stdin=str(a), expected_stdout=str(o)) for i, (a, o) in enumerate(pairs)]
    if not isinstance(value, list):
        raise ValueError(f"expected a list of tests, got {type(value).__name__}")
    return [_test(t, i, entry, tag) for i, t in enumerate(value)]


def _field_tests(obj: dict[str, Any], name: str, entry: str, tag: str) -> list[TestCase]:
    try:
        return _tests(obj.get(name, []), entry, tag)
    except (ValueError, TypeError, SyntaxError) as exc:
        raise ValueError(f"field {name!r}: {exc}") from None


def _entry(obj: dict[str, Any]) -> str:
    meta = _decoded(obj.get("metadata") or {})
    return str(obj.get("entry_point") or obj.get("fn_name") or (meta.get("func_name") if isinstance(meta, dict) else "")
               or "")


def problem_from_json(obj: Any, *, n_visible: int = 2, default_split: str = "train") -> Problem:
    """A :class:`Problem` from one decoded JSONL line.

    Raises:
        ValueError: A field is missing or malformed (the message names it).
    """
    if not isinstance(obj, dict):
        raise ValueError(f"a problem is a JSON object, got {type(obj).__name__}")
    prompt = next((obj[f] for f in _PROMPT_FIELDS if obj.get(f)), None)
    if not isinstance(prompt, str):
        raise ValueError(f"field 'prompt' is missing (or one of {_PROMPT_FIELDS[1:]})")
    entry = _entry(obj)
    fields = [("visible_tests", "hidden_tests"), ("public_test_cases", "private_test_cases"), (None, "tests")]
    visible: list[TestCase] = []
    hidden: list[TestCase] = []
    for vis, hid in fields:
        if hid in obj or (vis and vis in obj):
            visible = _field_tests(obj, vis, entry, "visible") if vis else []
            hidden = _field_tests(obj, hid, entry, "hidden")
            if vis == "public_test_cases":
                hidden = visible + hidden
            break
    if not hidden:
        raise ValueError("field 'hidden_tests' is missing or empty (or 'private_test_cases' / 'tests'); "
                         "a problem needs at least one hidden test")
    kind = obj.get("kind", "synth")
    if kind not in ("synth", "bugfix") or (kind == "bugfix" and not obj.get("buggy_code")):
        raise ValueError(f"field 'kind' is {kind!r}; use 'synth', or 'bugfix' with a 'buggy_code'")
    split = obj.get("split") or default_split
    if split not in ("train", "test"):
        raise ValueError(f"field 'split' is {split!r}; use 'train' or 'test'")
    return Problem(id=str(obj.get("id") or obj.get("question_id") or prompt[:60]), prompt=prompt, entry_point=entry,
                   signature=str(obj.get("signature") or obj.get("starter_code") or ""),
                   visible=tuple(visible or hidden[:n_visible]), hidden=tuple(hidden), kind=kind,
                   solution=str(obj.get("solution") or ""), buggy_code=str(obj.get("buggy_code") or ""), split=split)


def read_jsonl(path: str | Path, *, n_visible: int = 2) -> list[Problem]:
    """Problems from a JSONL file (see the module docstring for the fields).

    Raises:
        SchemaError: The file is missing or empty, or a line is malformed (named by line and field).
    """
    p = Path(path)
    if not p.is_file():
        raise SchemaError(f"code problems file {str(p)!r} does not exist; write one with `python -m arborl.code.data OUT_DIR`")
    out = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(problem_from_json(json.loads(line), n_visible=n_visible))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            raise SchemaError(f"{p}:{n}: {exc}") from None
    if not out:
        raise SchemaError(f"code problems file {str(p)!r} holds no problems")
    return out


def _test_json(t: TestCase) -> dict[str, Any]:
    return {"call": t.call, "expected": t.expected} if t.call is not None else {"input": t.stdin, "output": t.expected_stdout}


def problem_to_json(pr: Problem) -> dict[str, Any]:
    """The JSONL object of a problem (arborl's fields)."""
    return {"id": pr.id, "prompt": pr.prompt, "entry_point": pr.entry_point, "signature": pr.signature,
            "kind": pr.kind, "visible_tests": [_test_json(t) for t in pr.visible],
            "hidden_tests": [_test_json(t) for t in pr.hidden], "solution": pr.solution,
            "buggy_code": pr.buggy_code, "split": pr.split}


def write_jsonl(path: str | Path, problems: list[Problem]) -> None:
    """Write problems one JSON object a line."""
    Path(path).write_text("".join(json.dumps(problem_to_json(pr)) + "\n" for pr in problems))


def main(argv: list[str] | None = None) -> None:
    """``python -m arborl.code.data OUT_DIR``: the generated problems as ``train.jsonl`` and ``test.jsonl``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--n", type=int, default=500, help="training problems (and a quarter as many held out)")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "train.jsonl", [generate_problem(k) for k in range(args.n)])
    write_jsonl(out / "test.jsonl", [generate_problem(k, test=True) for k in range(max(args.n // 4, 1))])


if __name__ == "__main__":
    main()

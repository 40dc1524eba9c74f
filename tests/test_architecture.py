"""The dependency rule: credit/ and loss/ are pure tensor code that imports nothing from env, rollout or policy."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "arborl"
FORBIDDEN = ("arborl.env", "arborl.rollout", "arborl.policy", "arborl.train", "arborl.store", "arborl.sandbox")


def imports_of(path: Path) -> set[str]:
    mods: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
    return mods


def test_credit_and_loss_import_nothing_upstream():
    for sub in ("credit", "loss"):
        files = list((PKG / sub).glob("*.py"))
        assert files
        for f in files:
            bad = [m for m in imports_of(f) if m.startswith(FORBIDDEN)]
            assert not bad, f"{f.relative_to(PKG.parent)} imports {bad}"


def test_env_knows_nothing_about_training():
    for f in (PKG / "env").rglob("*.py"):
        bad = [m for m in imports_of(f) if m.startswith(("arborl.rollout", "arborl.policy", "arborl.train", "torch"))]
        assert not bad, f"{f.relative_to(PKG.parent)} imports {bad}"

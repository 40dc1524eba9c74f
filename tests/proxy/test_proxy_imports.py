"""Import boundaries of arborl/proxy: mitmproxy only in the proxy-venv files, stdlib only elsewhere.

arborl's process must never import mitmproxy (it lives in its own venv), the modules the proxy
process shares with arborl must be stdlib-only, and relay.py must run in a bare sandbox Python.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import arborl.proxy

PROXY_DIR = Path(arborl.proxy.__file__).parent
PROXY_VENV_ONLY = {"addon.py", "proxy_main.py"}


def _top_level_imports(path: Path) -> set[str]:
    mods: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module.split(".")[0])
    return mods


def test_only_proxy_venv_files_import_mitmproxy_and_the_rest_is_stdlib() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    for path in sorted(PROXY_DIR.glob("*.py")):
        third_party = _top_level_imports(path) - allowed
        if path.name in PROXY_VENV_ONLY:
            assert third_party <= {"mitmproxy"}, f"{path.name} imports {third_party}"
        else:
            assert not third_party, f"{path.name} must be stdlib-only, imports {third_party}"


def test_relay_has_no_relative_or_arborl_imports() -> None:
    tree = ast.parse((PROXY_DIR / "relay.py").read_text())
    relative = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level > 0]
    assert not relative
    assert "arborl" not in _top_level_imports(PROXY_DIR / "relay.py")


def test_importing_the_package_does_not_load_mitmproxy() -> None:
    code = "import sys, arborl.proxy, arborl.proxy.bench; print(any(m.startswith('mitmproxy') for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr

#!/usr/bin/env bash
# Network proxy: a dedicated venv with mitmproxy 11.0.2 (the last release for Python 3.11), kept
# apart from arborl's venv because it pins cryptography<44.1, which clashes with other packages
# (see docs/proxy.md). Also bubblewrap + Debian python3 for the sandbox wiring test. Idempotent.
#
#   ARBORL_PROXY_VENV   where to create the venv (default ~/.cache/arborl/proxy-venv)
#   ARBORL_PROXY_PYTHON interpreter to build it from (default: python3 on PATH, must be >= 3.10)
set -euo pipefail

venv="${ARBORL_PROXY_VENV:-$HOME/.cache/arborl/proxy-venv}"
python="${ARBORL_PROXY_PYTHON:-python3}"
pin="mitmproxy==11.0.2"

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
[ -x /usr/bin/python3 ] || need_apt+=(python3)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need_apt[@]}"
    else
        echo "proxy.sh: not root, skipping apt-get install ${need_apt[*]} (only the bwrap test needs them)" >&2
    fi
fi

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import mitmproxy.version as v, sys; sys.exit(v.VERSION != "11.0.2")' 2>/dev/null; then
    echo "proxy.sh: $venv already has $pin"
    exit 0
fi

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
    echo "proxy.sh: $python is older than 3.10; set ARBORL_PROXY_PYTHON to a python3.10-3.11" >&2
    exit 1
}
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "$pin"
"$venv/bin/python" -c 'from mitmproxy.tools.dump import DumpMaster; import mitmproxy.version as v; print("proxy.sh: mitmproxy", v.VERSION, "in '"$venv"'")'

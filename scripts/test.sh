#!/usr/bin/env bash
# Install arborl with its dev extras and every system package its tests need, then run the suite.
# Works on a fresh Debian machine as root (or with sudo-less apt as root in CI). Extra arguments
# go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch is pinned to the CPU wheel: an unpinned install pulls a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[dev]'
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq || true
fi
for s in scripts/setup/*.sh; do
  echo "== $s"
  bash "$s"
done
echo "== ruff check"
python -m ruff check .
export ARBORL_PROGRESS=0
# In CI a test whose service is missing fails instead of skipping.
if [ "${CI:-}" = "true" ]; then export ARBORL_REQUIRE_SERVICES=1; fi
exec python -m pytest -q -p no:cacheprovider "$@"

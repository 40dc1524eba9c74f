#!/usr/bin/env bash
# Install arborl with its dev extras and every system package its tests need, then run the suite.
# Works on a fresh Debian machine as root (or with sudo-less apt as root in CI). Extra arguments
# go to pytest instead of the default selection, e.g. `bash scripts/test.sh tests/store`.
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
# The default suite skips the tests marked slow (end-to-end runs over ~20 s each); CI runs them all.
# Any argument replaces the default: `bash scripts/test.sh -m ""` runs everything here too.
# Test files are spread over one worker process per core (pytest-xdist; each file stays on one
# worker, so module fixtures are built once); ARBORL_TEST_WORKERS=0 runs them in this process.
if [ "$#" -eq 0 ]; then
  if [ "${CI:-}" != "true" ]; then set -- -m "not slow"; fi
  set -- "$@" -n "${ARBORL_TEST_WORKERS:-auto}" --dist loadfile
fi
exec python -m pytest -q -p no:cacheprovider "$@"

#!/usr/bin/env bash
# Trajectory explorer (arborl view): the distribution's Chromium, which the browser tests drive
# through Playwright's Python API (no browser download), and the Python side (FastAPI, uvicorn,
# Playwright) into the active virtual environment. Idempotent. Without root the apt part is
# skipped with a note (tests/view/test_browser.py then skips itself).
set -euo pipefail

if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
        echo "viewer.sh: not root, skipping apt-get install chromium (the browser tests will be skipped)" >&2
    else
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
    fi
fi

python -m pip install --quiet "fastapi>=0.110" "uvicorn>=0.29" "playwright>=1.40"

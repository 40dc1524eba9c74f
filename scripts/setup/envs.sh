#!/usr/bin/env bash
# Python packages for arborl.env: Gymnasium for GymTextEnv and its tests (the `gym` extra).
set -euo pipefail
python -m pip install --quiet "gymnasium>=1.0"

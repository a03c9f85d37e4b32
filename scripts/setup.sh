#!/usr/bin/env bash
# Create ./.venv with the project and everything its demo and tests need. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch 2.13.0 is a CPU build on local disk here; a plain `torch` would pull a CUDA build.
python -m pip install -q -e ".[test]"

#!/usr/bin/env bash
# Create ./.venv with the project (Python package + the prebuilt JupyterLab sidebar) and
# everything its demo and tests need. Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch 2.13.0 (in the test extra) is a CPU build on local disk here; a plain `torch` would
# pull a multi-GB CUDA build. The editable install also builds the sidebar (jlpm, via
# hatch-jupyter-builder) into labextension/.
python -m pip install -q -e ".[test]"
# A development build of the sidebar may leave labextension/install.json; the wheel ships the
# checkout's install.json at that very path (pyproject's shared-data), and two files at one
# path fail `pip wheel .` (tests/test_wheel_install.py, the images' build.sh).
rm -f labextension/install.json
# The sidebar's tools (eslint, prettier, stylelint, jest) as package.json and yarn.lock name them:
# the editable build above installs them only when it rebuilds the sidebar, so a checkout whose
# labextension/ is current would lint with a node_modules older than its package.json.
jlpm install >/dev/null
# Point JupyterLab at the built sidebar of this checkout (a wheel install ships it instead).
jupyter labextension develop --overwrite . >/dev/null

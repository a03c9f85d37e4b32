#!/usr/bin/env bash
# Set up, then run the quickstart notebook headlessly: a 4-rank %%distributed job on the
# local backend (gloo on CPU), printing what comes back to the kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python examples/run_notebook.py examples/quickstart.ipynb

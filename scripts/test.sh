#!/usr/bin/env bash
# Set up, then run the whole test suite (Python + frontend + browser). Fails loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest tests "$@"

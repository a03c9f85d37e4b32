#!/usr/bin/env bash
# Regenerate the README's screenshots (docs/img/*.png) with the browser tests that take them:
# a real JupyterLab with this checkout's extension, real jobs, headless chromium.
#   sidebar.png, sidebar-detail.png, sidebar-dark.png  tests/browser/test_sidebar_e2e.py
#   monitor.png                                         tests/browser/test_monitor.py
#   monitor-curves*.png, sidebar-curves*.png            tests/browser/test_curves.py
# Needs the built extension (jlpm build) and chromium, as the browser tests do
# (scripts/test.sh sets both up). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then
  . .venv/bin/activate
fi
export MLCLUSTER_DOCS_IMG="$PWD/docs/img"
python -m pytest tests/browser -k "screenshots or monitor or curves" -q "$@"
ls -l docs/img

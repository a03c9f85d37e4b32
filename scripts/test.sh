#!/usr/bin/env bash
# Set up, then run the whole test suite: the sidebar's lint (eslint + prettier, stylelint on its
# CSS) and unit tests (jest, which also checks src/model/api-types.ts against the API document),
# hadolint on the images' Containerfiles, the layers' import contracts (lint-imports), the
# Python's lint and types (ruff check, ruff format --check, mypy), then
# every Python test (engine, kernel, server, Kubernetes emulator, controller, real-browser
# sidebar). Fails loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fast" ]; then
  # The fast tier, to run while working (CI runs everything, below): the tests marked `unit`
  # by tests/tiers.py (they use no fixture that starts a system), in parallel, each stopped
  # after 5 s (times MLCLUSTER_TEST_WAIT_SCALE on a loaded machine). No setup, lint or jest:
  # .venv must exist. Bytecode is cached (ignored by git) so the next run imports faster.
  shift
  . .venv/bin/activate
  unset PYTHONDONTWRITEBYTECODE
  timeout=$(python -c "import os; print(5 * float(os.environ.get('MLCLUSTER_TEST_WAIT_SCALE') or 1))")
  exec python -m pytest tests -m unit -n "${MLCLUSTER_TEST_WORKERS:-2}" --dist loadfile \
    --timeout "$timeout" "$@"
fi
bash scripts/setup.sh
. .venv/bin/activate
if [ ! -x /usr/bin/chromium ]; then
  # The sidebar is tested in a real browser: Debian's chromium, driven by Playwright.
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null
  fi
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  # The slurm backend is tested against a real one-node Slurm (tests/slurm/cluster.py starts
  # munged, slurmctld and slurmd itself): Debian's slurm-wlm and munge. The packages' own
  # services are not needed (nor started by apt in a container).
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq slurm-wlm munge >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq slurm-wlm munge >/dev/null
  fi
fi
jlpm lint
jlpm test
# The images' Containerfiles (deploy/images): hadolint, from the test extra; any finding fails.
# A glob that matches nothing stays literal, so hadolint fails on it too.
hadolint deploy/images/*.Containerfile
# The layers (pyproject.toml [tool.importlinter]; docs/ARCHITECTURE.md): an import that reaches
# up a layer, lazy ones inside functions included, fails. No cache file left in the tree.
lint-imports --no-cache
# The Python's lint, style and types (pyproject.toml [tool.ruff], [tool.mypy]; versions pinned
# in the test extra): any finding fails, before a single test runs.
ruff check .
ruff format --check .
mypy
# Test files run in parallel worker processes, a file's tests together in one (their
# module-scoped servers and emulators are shared): most tests wait on processes, kernels and
# servers rather than compute, so two workers on two cores cut the wall time well below a
# serial run (three were faster still, but made timing-sensitive browser and pool tests flaky).
python -m pytest tests -n "${MLCLUSTER_TEST_WORKERS:-2}" --dist loadfile "$@"

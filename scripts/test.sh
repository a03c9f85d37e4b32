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
# The system packages the tests need, installed by apt while setup.sh installs the Python and
# JavaScript ones (independent; one `apt-get update` for all): Debian's chromium (the sidebar
# is tested in a real browser, driven by Playwright), slurm-wlm and munge (the slurm backend is
# tested against a real one-node Slurm: tests/slurm/cluster.py starts munged, slurmctld and
# slurmd itself; the packages' own services are not needed, nor started by apt in a
# container). Waited for, and its failure fatal, before the first test.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  missing+=(slurm-wlm munge)
fi
apt_pid=
if [ ${#missing[@]} -gt 0 ]; then
  sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  ("${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq "${missing[@]}") \
    >"$logs/apt.log" 2>&1 &
  apt_pid=$!
fi
bash scripts/setup.sh
. .venv/bin/activate
# The gates, all at once (independent, and none uses more than a core for long: together they
# take about as long as the longest alone, eslint's; one after the other they took the sum:
# measured under load, 3.4 min at once, eslint 3.4, jest 2.9, mypy 2.6 of it); each one's
# output is printed after it, and any failure fails the run before a single test runs:
# - the sidebar's lint (eslint + prettier, stylelint) and unit tests (jest);
# - the images' Containerfiles (deploy/images): hadolint, from the test extra; any finding
#   fails. A glob that matches nothing stays literal, so hadolint fails on it too;
# - the layers (pyproject.toml [tool.importlinter]; docs/ARCHITECTURE.md): an import that
#   reaches up a layer, lazy ones inside functions included, fails. No cache file left;
# - the Python's lint, style and types (pyproject.toml [tool.ruff], [tool.mypy]; versions
#   pinned in the test extra).
gates=(
  "jlpm lint"
  "jlpm test"
  "hadolint deploy/images/*.Containerfile"
  "lint-imports --no-cache"
  "ruff check ."
  "ruff format --check ."
  "mypy"
)
pids=()
for i in "${!gates[@]}"; do
  bash -c "${gates[$i]}" >"$logs/gate-$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!gates[@]}"; do
  if wait "${pids[$i]}"; then
    echo "== ${gates[$i]}: ok"
  else
    echo "== ${gates[$i]}: FAILED"
    failed=1
  fi
  cat "$logs/gate-$i.log"
done
[ "$failed" = 0 ] || exit 1
if [ -n "$apt_pid" ] && ! wait "$apt_pid"; then
  cat "$logs/apt.log"
  echo "== apt-get install ${missing[*]}: FAILED" >&2
  exit 1
fi
# Test files run in parallel worker processes, a file's tests together in one (their
# module-scoped servers and emulators are shared): most tests wait on processes, kernels and
# servers rather than compute, so two workers on two cores cut the wall time well below a
# serial run (three were faster still, but made timing-sensitive browser and pool tests flaky).
python -m pytest tests -n "${MLCLUSTER_TEST_WORKERS:-2}" --dist loadfile "$@"

#!/usr/bin/env bash
# The test command: install what the tests need on a fresh machine, then run every check CI runs.
#   Debian packages (as root, when missing): mosquitto for the broker tests, iproute2 for the multihost test,
#   chromium for the dashboard's browser test,
#   the word lists of the scandinavian dataset (wnorwegian, wswedish, wdanish).
#   Python packages: torch 2.14.1 and torchvision 0.29.1 (from this machine's disk), p2pfed and its test and ray
#   extras.
# Then: ruff and mypy over p2pfed/, import-linter's layers contract, the default (fast) tests with their line coverage
# (node processes included) printed at their end: a figure to read, not a gate; then the multihost, broker, browser,
# ray and slow tests without coverage: under it they took 52 of CI's 60 minutes on a slow day (docs/development.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then
  need=""
  command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || need="$need mosquitto"
  command -v ip >/dev/null || need="$need iproute2"
  command -v chromium >/dev/null || need="$need chromium"  # the dashboard's browser test (Playwright drives it)
  for list in bokmaal:wnorwegian swedish:wswedish danish:wdanish; do  # the scandinavian dataset's word lists
    [ -f "/usr/share/dict/${list%%:*}" ] || need="$need ${list#*:}"
  done
  if [ -n "$need" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
  fi
fi
python3 -m pip install -q --disable-pip-version-check torch==2.14.1 torchvision==0.29.1 -e '.[test,ray]'
echo "== ruff"; python3 -m ruff check p2pfed tests benchmarks tools
echo "== mypy"; python3 -m mypy p2pfed
echo "== layers"  # the contract in pyproject.toml: imports run one way, down the layers
python3 -c "from importlinter.cli import lint_imports_command; lint_imports_command(['--no-cache'])"
rm -f .coverage .coverage.*
echo "== default tests"; python3 -m pytest -q --cov --cov-report=term
echo "== multihost, broker, browser, ray and slow tests"; python3 -m pytest -q -m "multihost or broker or browser or ray or slow"

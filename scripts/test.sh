#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run it all:
# lint, unit and property tests, the local cloud servers, Terraform validation.
#
#   bash scripts/test.sh            the full suite (what CI runs)
#   bash scripts/test.sh --quick    lint and every test that needs no tool environment (the BigQuery
#                                   emulator, Levanter, Terraform), property tests at a tenth of their
#                                   examples: a few minutes on two cores (tests/tiers.py)
# Any other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${LOSSSPIKE_VENV:-.venv}"
# The tests' lossspike processes refuse an unknown LOSSSPIKE_* variable (a misspelt setting), and
# this one is the script's, not the product's: with it set, 20 tests failed on "unknown setting".
unset LOSSSPIKE_VENV

QUICK=0
if [ "${1:-}" = "--quick" ]; then
  QUICK=1
  shift
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# Installed once per pyproject.toml: an unchanged project needs no second pass through pip.
stamp="$VENV/.lossspike-installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e '.[test]'
  rm -f "$VENV"/.lossspike-installed-*
  touch "$stamp"
fi

if [ "$QUICK" = 0 ]; then
  # Tools with pins of their own live in their own environments under .tools/.
  for setup in tools/*/setup.sh; do
    [ -f "$setup" ] && bash "$setup"
  done
fi

# The tests start hundreds of Python processes; with bytecode written once, each does not compile
# the project and its dependencies again (some machines set PYTHONDONTWRITEBYTECODE=1).
unset PYTHONDONTWRITEBYTECODE

"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
if [ "$QUICK" = 1 ]; then
  QUICK_TESTS=1 exec "$VENV/bin/python" -m pytest -q -n 2 --dist worksteal "$@"
fi
exec "$VENV/bin/python" -m pytest "$@"

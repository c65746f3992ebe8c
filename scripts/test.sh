#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run it all:
# lint, unit and property tests, the local cloud servers, Terraform validation.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${LOSSSPIKE_VENV:-.venv}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e '.[test]'

# Tools with pins of their own live in their own environments under .tools/.
for setup in tools/*/setup.sh; do
  [ -f "$setup" ] && bash "$setup"
done

"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
exec "$VENV/bin/python" -m pytest "$@"

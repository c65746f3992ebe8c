#!/usr/bin/env bash
# Install Levanter (PyPI "marin-levanter") with CPU JAX, plus this project,
# into a virtual environment of its own: Levanter pins JAX, Equinox, draccus and
# friends, which the project's own venv must not carry.
#
# Usage: tools/levanter/setup.sh [DIR]
#   DIR defaults to <repo>/.tools/levanter, where tests/test_levanter_tracker.py
#   looks for it (or $LOSSSPIKE_LEVANTER_DIR).
#   Idempotent: a re-run with everything in place returns at once; the stamp
#   carries the hash of pyproject.toml, so a change to the project's
#   dependencies re-installs.
#
# The project is installed editable, so the venv always runs the working
# tree's lossspike (the tracker under test), never a stale copy.
set -euo pipefail

# The newest release for Python 3.11 (the machines' python3): later ones require Python >= 3.12.
MARIN_LEVANTER_VERSION=0.2.20.dev202606180959

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dir="${1:-${LOSSSPIKE_LEVANTER_DIR:-$repo/.tools/levanter}}"
project_hash="$(cat "$repo/pyproject.toml" "$here/setup.sh" | sha256sum | cut -c1-12)"
stamp="$dir/.lossspike-setup-$MARIN_LEVANTER_VERSION-$project_hash"

if [[ -f "$stamp" && -x "$dir/bin/python" ]]; then
    echo "marin-levanter $MARIN_LEVANTER_VERSION already set up in $dir"
    exit 0
fi

python="${PYTHON:-}"
if [[ -z "$python" ]]; then
    for candidate in python3.11 python3.12 python3.13 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then python="$candidate"; break; fi
    done
fi
[[ -n "$python" ]] || { echo "setup.sh: no python3 found (set PYTHON=...)" >&2; exit 1; }

echo "Setting up marin-levanter $MARIN_LEVANTER_VERSION in $dir (python: $python)"
started=$(date +%s)
"$python" -m venv "$dir"
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
# jax without extras is the CPU build (jaxlib from PyPI); Levanter's own pins decide its version.
# GitPython: levanter.tracker.helpers imports it, and this release does not declare it.
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check \
    "marin-levanter==$MARIN_LEVANTER_VERSION" jax GitPython
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check -e "$repo[publish]"

# Smoke: Levanter's tracker registry and this project's tracker import together.
JAX_PLATFORMS=cpu "$dir/bin/python" - <<'PY'
import jax
import levanter.tracker

from lossspike.levanter_tracker import LossspikeTrackerConfig

print(f"levanter tracker OK on jax {jax.__version__} ({jax.devices()[0].platform})", LossspikeTrackerConfig)
PY
rm -f "$dir"/.lossspike-setup-*
touch "$stamp"
echo "marin-levanter set up in $(( $(date +%s) - started )) s"

#!/usr/bin/env bash
# Install a current wandb release, plus this project with its `load` extra, into a virtual
# environment of its own: the tests write real offline runs with it and read them with the
# project's own .wandb reader running on that release's protobufs (tests/test_load_wandb.py),
# while the project's venv keeps an older wandb (the one whose DataStore the reader is checked
# against).
#
# Usage: tools/wandb/setup.sh [DIR]
#   DIR defaults to <repo>/.tools/wandb, where tests/wandb_runs.py looks for it (or
#   $LOSSSPIKE_WANDB_DIR).
#   Idempotent: a re-run with everything in place returns at once; the stamp carries the hash of
#   pyproject.toml and this script, so a change to the project's dependencies re-installs.
#
# The project is installed editable, so the venv always runs the working tree's reader.
set -euo pipefail

# The newest release checked: 0.30 removed wandb.sdk.internal.datastore, the package's own reader.
WANDB_VERSION=0.31.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dir="${1:-${LOSSSPIKE_WANDB_DIR:-$repo/.tools/wandb}}"
project_hash="$(cat "$repo/pyproject.toml" "$here/setup.sh" | sha256sum | cut -c1-12)"
stamp="$dir/.lossspike-setup-$WANDB_VERSION-$project_hash"

if [[ -f "$stamp" && -x "$dir/bin/python" ]]; then
    echo "wandb $WANDB_VERSION already set up in $dir"
    exit 0
fi

python="${PYTHON:-}"
if [[ -z "$python" ]]; then
    for candidate in python3.11 python3.12 python3.13 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then python="$candidate"; break; fi
    done
fi
[[ -n "$python" ]] || { echo "setup.sh: no python3 found (set PYTHON=...)" >&2; exit 1; }

echo "Setting up wandb $WANDB_VERSION in $dir (python: $python)"
started=$(date +%s)
"$python" -m venv "$dir"
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check "wandb==$WANDB_VERSION"
# Installed after wandb, as into a training environment that already has it: the extra must keep it.
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check -e "$repo[load]"

# Smoke: the load extra left the release in place, and the reader imports on its protobufs.
"$dir/bin/python" - "$WANDB_VERSION" <<'PY'
import sys

import wandb
from wandb.proto.wandb_internal_pb2 import Record

import lossspike.ingest.wandb

assert wandb.__version__ == sys.argv[1], f"the load extra changed wandb {sys.argv[1]} to {wandb.__version__}"
print(f"wandb {wandb.__version__} OK", Record.DESCRIPTOR.full_name, lossspike.ingest.wandb.__name__)
PY
rm -f "$dir"/.lossspike-setup-*
touch "$stamp"
echo "wandb set up in $(( $(date +%s) - started )) s"

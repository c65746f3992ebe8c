#!/usr/bin/env bash
# Install the BigQuery emulator (PyPI "bqemulator") into its own virtual
# environment, apart from the project's venv: it pins sqlglot < 30.12 and
# protobuf < 7, which the project itself does not accept.
#
# Usage: tools/bqemulator/setup.sh [DIR]
#   DIR defaults to <repo>/.tools/bqemulator, where the tests look for it.
#   Idempotent: a re-run with everything in place returns at once.
#
# The emulator loads DuckDB's "spatial" extension at start and would download
# it. Offline that fails, so we pin DuckDB to the version for which PyPI ships
# the extension as a wheel (duckdb-extension-spatial) and install the extension
# file into DIR/home/.duckdb; tests/servers/bigquery.py runs the server with
# HOME=DIR/home so DuckDB finds it without any network.
#
# lossspike_bqemu_patches.py (next to this script) is copied into the venv's
# site-packages with a .pth file that imports it at interpreter start: it
# patches the emulator where it differs from BigQuery in ways the product
# relies on (see its docstring). The stamp carries the patch's hash, so editing
# the patch makes the next run re-install it.
set -euo pipefail

BQEMULATOR_VERSION=1.4.0
DUCKDB_VERSION=1.5.5   # must equal the duckdb-extension-spatial version

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dir="${1:-$repo/.tools/bqemulator}"
patch="$here/lossspike_bqemu_patches.py"
patch_hash="$(sha256sum "$patch" | cut -c1-12)"
stamp="$dir/.lossspike-setup-$BQEMULATOR_VERSION-$DUCKDB_VERSION-patch-$patch_hash"

if [[ -f "$stamp" && -x "$dir/bin/bqemulator" ]]; then
    echo "bqemulator $BQEMULATOR_VERSION already set up in $dir"
    exit 0
fi

python="${PYTHON:-}"
if [[ -z "$python" ]]; then
    for candidate in python3.11 python3.12 python3.13 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then python="$candidate"; break; fi
    done
fi
[[ -n "$python" ]] || { echo "setup.sh: no python3 found (set PYTHON=...)" >&2; exit 1; }

echo "Setting up bqemulator $BQEMULATOR_VERSION in $dir (python: $python)"
"$python" -m venv "$dir"
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check \
    "bqemulator==$BQEMULATOR_VERSION" \
    "duckdb==$DUCKDB_VERSION" \
    "duckdb-extension-spatial==$DUCKDB_VERSION" \
    numpy

# Register the bundled extension file in a DuckDB home private to this venv.
mkdir -p "$dir/home"
HOME="$dir/home" "$dir/bin/python" - <<'PY'
import pathlib

import duckdb
import duckdb_extension_spatial

root = pathlib.Path(duckdb_extension_spatial.__file__).parent / "extensions"
files = sorted(root.glob("*/spatial.duckdb_extension"))
if not files:
    raise SystemExit(f"no spatial.duckdb_extension under {root}")
con = duckdb.connect()
con.execute(f"INSTALL '{files[-1]}'")
con.execute("LOAD spatial")
con.execute("SELECT ST_AsText(ST_Point(1, 2))").fetchall()
print(f"DuckDB {duckdb.__version__}: spatial extension installed offline")
PY

# Install the patches; the .pth line runs at every interpreter start of this venv.
site="$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cp "$patch" "$site/lossspike_bqemu_patches.py"
echo "import lossspike_bqemu_patches; lossspike_bqemu_patches.install()" >"$site/lossspike_bqemu_patches.pth"

# Smoke: the CLI imports, and the patches apply to the installed release.
"$dir/bin/bqemulator" --version
"$dir/bin/python" - <<'PY'
import bqemulator.jobs.executor as executor
from importlib.metadata import version

import lossspike_bqemu_patches as patches

if version("bqemulator") != patches.PATCHED_VERSION or not getattr(executor, "_lossspike_patched", False):
    raise SystemExit(f"lossspike_bqemu_patches did not apply to bqemulator {version('bqemulator')}")
print("lossspike_bqemu_patches applied")
PY
rm -f "$dir"/.lossspike-setup-*
touch "$stamp"

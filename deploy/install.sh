#!/usr/bin/env bash
# Install syncd for the current user: the package, a starter config, the systemd user unit.
#
#   deploy/install.sh                      pipx if present, else a venv under ~/.local
#   deploy/install.sh --prefix DIR         a venv in DIR/lib/syncd, the command in DIR/bin
#   deploy/install.sh --no-systemctl       write the unit file but do not enable or start it
#
# Safe to run again: it upgrades the package and keeps an existing config.
set -euo pipefail

usage() {
    cat <<USAGE
usage: $0 [--prefix DIR] [--venv] [--from SPEC] [--no-systemctl] [--unit-dir DIR] [--config FILE]

  --prefix DIR     install into a venv at DIR/lib/syncd/venv, link DIR/bin/syncd (implies --venv)
  --venv           use a venv under the prefix (default ~/.local) even when pipx is present
  --from SPEC      what to install (default: this checkout, $repo)
  --no-systemctl   write the unit file only; do not run systemctl --user
  --unit-dir DIR   where the unit goes (default \${XDG_CONFIG_HOME:-~/.config}/systemd/user)
  --config FILE    starter config path (default \${XDG_CONFIG_HOME:-~/.config}/syncd/config.toml)
USAGE
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
config_home="${XDG_CONFIG_HOME:-$HOME/.config}"
prefix=""
spec="$repo"
use_venv=0
use_systemctl=1
unit_dir="$config_home/systemd/user"
config="${SYNCD_CONFIG:-$config_home/syncd/config.toml}"
python="${PYTHON:-python3}"

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix="${2:?--prefix needs a directory}"; use_venv=1; shift 2 ;;
        --prefix=*) prefix="${1#*=}"; use_venv=1; shift ;;
        --venv) use_venv=1; shift ;;
        --from) spec="${2:?--from needs a package spec}"; shift 2 ;;
        --from=*) spec="${1#*=}"; shift ;;
        --no-systemctl) use_systemctl=0; shift ;;
        --unit-dir) unit_dir="${2:?--unit-dir needs a directory}"; shift 2 ;;
        --unit-dir=*) unit_dir="${1#*=}"; shift ;;
        --config) config="${2:?--config needs a file}"; shift 2 ;;
        --config=*) config="${1#*=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown option: $1" >&2; usage >&2; exit 2 ;;
    esac
done

# 1. The package.
if [ "$use_venv" = 0 ] && command -v pipx >/dev/null 2>&1; then
    echo "installing $spec with pipx"
    pipx install --force "$spec"
    bin_dir="$(pipx environment --value PIPX_BIN_DIR 2>/dev/null || echo "$HOME/.local/bin")"
    bin="$bin_dir/syncd"
else
    prefix="$(mkdir -p "${prefix:-$HOME/.local}" && cd "${prefix:-$HOME/.local}" && pwd)"
    venv="$prefix/lib/syncd/venv"
    echo "installing $spec into $venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade "$spec"
    mkdir -p "$prefix/bin"
    ln -sfn "$venv/bin/syncd" "$prefix/bin/syncd"
    bin="$prefix/bin/syncd"
fi
"$bin" --version

# 2. A starter config (never overwritten).
if [ -e "$config" ]; then
    echo "keeping existing config $config"
else
    mkdir -p "$(dirname "$config")"
    umask 077
    cat >"$config" <<'CONFIG'
# syncd configuration: every key is optional (README.md, "Configuration").
# Out of the box syncd backs up ~/.claude into a local directory store
# (~/.local/share/syncd/store). For S3, R2, B2, MinIO or SeaweedFS copy the keys
# from one of deploy/config/*.toml; credentials come from the AWS environment
# variables or ~/.aws/credentials, never from this file.

# store = "s3://my-bucket/claude"
# s3_endpoint_url = "https://<account>.r2.cloudflarestorage.com"
# s3_region = "auto"
# machine_id = "laptop"
# log_level = "INFO"
# metrics_port = 9737        # Prometheus text on 127.0.0.1:9737/metrics (0 = off)
CONFIG
    echo "wrote starter config $config"
fi

# 3. The systemd user unit, pointing at the installed command.
mkdir -p "$unit_dir"
sed "s|^ExecStart=.*|ExecStart=$bin run|" "$repo/systemd/syncd.service" >"$unit_dir/syncd.service"
echo "wrote $unit_dir/syncd.service"

if [ "$use_systemctl" = 1 ]; then
    if command -v systemctl >/dev/null 2>&1 && systemctl --user show-environment >/dev/null 2>&1; then
        systemctl --user daemon-reload
        systemctl --user enable --now syncd.service
        systemctl --user --no-pager status syncd.service | head -n 5 || true
    else
        echo "no systemd user manager reachable: start it later with" \
             "'systemctl --user enable --now syncd', or run '$bin run' by hand" >&2
    fi
fi

case ":$PATH:" in
    *":$(dirname "$bin"):"*) ;;
    *) echo "note: $(dirname "$bin") is not on your PATH" ;;
esac
linger="$(loginctl show-user "$(id -un)" --property=Linger --value 2>/dev/null || true)"
if [ "$linger" != "yes" ]; then
    echo "to keep backing up while you are logged out: loginctl enable-linger $(id -un)"
fi
echo "check it with: syncd status"

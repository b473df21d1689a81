#!/usr/bin/env bash
# Remove syncd's package and unit. Config and state stay unless --purge; the store
# (your backups) is never touched.
set -euo pipefail

usage() {
    cat <<USAGE
usage: $0 [--prefix DIR] [--no-systemctl] [--unit-dir DIR] [--purge]

  --prefix DIR     the prefix given to install.sh (default: pipx if it has syncd, else ~/.local)
  --no-systemctl   do not run systemctl --user (just remove files)
  --unit-dir DIR   where the unit is (default \${XDG_CONFIG_HOME:-~/.config}/systemd/user)
  --purge          also delete the config and the local state (never the store)
USAGE
}

config_home="${XDG_CONFIG_HOME:-$HOME/.config}"
state_home="${XDG_STATE_HOME:-$HOME/.local/state}"
prefix=""
use_systemctl=1
unit_dir="$config_home/systemd/user"
purge=0

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
        --prefix=*) prefix="${1#*=}"; shift ;;
        --no-systemctl) use_systemctl=0; shift ;;
        --unit-dir) unit_dir="${2:?--unit-dir needs a directory}"; shift 2 ;;
        --unit-dir=*) unit_dir="${1#*=}"; shift ;;
        --purge) purge=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "uninstall.sh: unknown option: $1" >&2; usage >&2; exit 2 ;;
    esac
done

if [ "$use_systemctl" = 1 ] && command -v systemctl >/dev/null 2>&1 \
        && systemctl --user show-environment >/dev/null 2>&1; then
    systemctl --user disable --now syncd.service 2>/dev/null || true
fi
if [ -e "$unit_dir/syncd.service" ]; then
    rm -f "$unit_dir/syncd.service"
    echo "removed $unit_dir/syncd.service"
    if [ "$use_systemctl" = 1 ] && command -v systemctl >/dev/null 2>&1; then
        systemctl --user daemon-reload 2>/dev/null || true
    fi
fi

if [ -z "$prefix" ] && command -v pipx >/dev/null 2>&1 \
        && pipx list --short 2>/dev/null | grep -q '^syncd '; then
    pipx uninstall syncd
else
    prefix="${prefix:-$HOME/.local}"
    if [ -d "$prefix/lib/syncd/venv" ]; then
        rm -rf "$prefix/lib/syncd"
        echo "removed $prefix/lib/syncd"
    fi
    if [ -L "$prefix/bin/syncd" ]; then
        rm -f "$prefix/bin/syncd"
        echo "removed $prefix/bin/syncd"
    fi
fi

if [ "$purge" = 1 ]; then
    rm -rf "$config_home/syncd" "$state_home/syncd"
    echo "removed $config_home/syncd and $state_home/syncd"
else
    echo "kept the config ($config_home/syncd) and state ($state_home/syncd); --purge removes them"
fi
echo "the store (your backups) was not touched"

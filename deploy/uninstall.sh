#!/usr/bin/env bash
# Remove syncd's package and service (the systemd user unit on Linux, the launchd agent on
# macOS). Config, state and logs stay unless --purge; the store (your backups) is never
# touched.
set -euo pipefail

usage() {
    cat <<USAGE
usage: $0 [--prefix DIR] [--no-service] [--unit-dir DIR] [--agent-dir DIR] [--purge]

  --prefix DIR     the prefix given to install.sh (default: pipx if it has syncd, else ~/.local)
  --no-service     do not run systemctl or launchctl (just remove files; --no-systemctl
                   is the same)
  --unit-dir DIR   Linux: where the unit is (default \${XDG_CONFIG_HOME:-~/.config}/systemd/user)
  --agent-dir DIR  macOS: where the plist is (default ~/Library/LaunchAgents)
  --purge          also delete the config, the local state and (macOS) the logs; never the store
USAGE
}

config_home="${XDG_CONFIG_HOME:-$HOME/.config}"
state_home="${XDG_STATE_HOME:-$HOME/.local/state}"
prefix=""
use_service=1
unit_dir="$config_home/systemd/user"
agent_dir="$HOME/Library/LaunchAgents"
label="io.github.syncd"
log_dir=""  # macOS only: where the agent's log is
purge=0

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
        --prefix=*) prefix="${1#*=}"; shift ;;
        --no-service|--no-systemctl) use_service=0; shift ;;
        --unit-dir) unit_dir="${2:?--unit-dir needs a directory}"; shift 2 ;;
        --unit-dir=*) unit_dir="${1#*=}"; shift ;;
        --agent-dir) agent_dir="${2:?--agent-dir needs a directory}"; shift 2 ;;
        --agent-dir=*) agent_dir="${1#*=}"; shift ;;
        --purge) purge=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "uninstall.sh: unknown option: $1" >&2; usage >&2; exit 2 ;;
    esac
done

if [ "$(uname -s)" = Darwin ]; then
    plist="$agent_dir/$label.plist"
    log_dir="$HOME/Library/Logs/syncd"
    if [ "$use_service" = 1 ] && command -v launchctl >/dev/null 2>&1; then
        # Stops the daemon (it finishes its segment in flight); not loaded is fine.
        launchctl bootout "gui/$(id -u)/$label" 2>/dev/null || true
    fi
    if [ -e "$plist" ]; then
        rm -f "$plist"
        echo "removed $plist"
    fi
else
    if [ "$use_service" = 1 ] && command -v systemctl >/dev/null 2>&1 \
            && systemctl --user show-environment >/dev/null 2>&1; then
        systemctl --user disable --now syncd.service 2>/dev/null || true
    fi
    # The drop-in install.sh wrote; one of the user's own (systemctl --user edit) stays.
    if [ -e "$unit_dir/syncd.service.d/paths.conf" ]; then
        rm -f "$unit_dir/syncd.service.d/paths.conf"
        rmdir "$unit_dir/syncd.service.d" 2>/dev/null || true
        echo "removed $unit_dir/syncd.service.d/paths.conf"
    fi
    if [ -e "$unit_dir/syncd.service" ]; then
        rm -f "$unit_dir/syncd.service"
        echo "removed $unit_dir/syncd.service"
        if [ "$use_service" = 1 ] && command -v systemctl >/dev/null 2>&1; then
            systemctl --user daemon-reload 2>/dev/null || true
        fi
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
    if [ -n "$log_dir" ]; then
        rm -rf "$log_dir"
        echo "removed $log_dir"
    fi
else
    echo "kept the config ($config_home/syncd) and state ($state_home/syncd); --purge removes them"
    if [ -n "$log_dir" ]; then
        echo "kept the logs ($log_dir); --purge removes them"
    fi
fi
echo "the store (your backups) was not touched"

#!/usr/bin/env bash
# Install syncd for the current user: the package, a starter config, and the service
# (a systemd user unit on Linux, a launchd user agent on macOS).
#
#   deploy/install.sh                      pipx if present, else a venv under ~/.local
#   deploy/install.sh --prefix DIR         a venv in DIR/lib/syncd, the command in DIR/bin
#   deploy/install.sh --no-service         write the unit or plist but do not start it
#
# Safe to run again: it upgrades the package and keeps an existing config (on macOS it
# also reloads the agent). Written for macOS's bash 3.2 as well.
set -euo pipefail

usage() {
    cat <<USAGE
usage: $0 [--prefix DIR] [--venv] [--from SPEC] [--no-service] [--unit-dir DIR]
          [--agent-dir DIR] [--config FILE]

  --prefix DIR     install into a venv at DIR/lib/syncd/venv, link DIR/bin/syncd (implies --venv)
  --venv           use a venv under the prefix (default ~/.local) even when pipx is present
  --from SPEC      what to install (default: this checkout, $repo)
  --no-service     write the service file only; do not enable, load or start it
                   (--no-systemctl is the same)
  --unit-dir DIR   Linux: where the unit goes (default \${XDG_CONFIG_HOME:-~/.config}/systemd/user)
  --agent-dir DIR  macOS: where the plist goes (default ~/Library/LaunchAgents, the only
                   place launchd loads it from at login)
  --config FILE    starter config path (default \${XDG_CONFIG_HOME:-~/.config}/syncd/config.toml)
USAGE
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
config_home="${XDG_CONFIG_HOME:-$HOME/.config}"
prefix=""
spec="$repo"
use_venv=0
use_service=1
unit_dir="$config_home/systemd/user"
agent_dir="$HOME/Library/LaunchAgents"
config="${SYNCD_CONFIG:-$config_home/syncd/config.toml}"
python="${PYTHON:-python3}"
label="io.github.syncd"
user_manager=0
log_dir="$HOME/Library/Logs/syncd"

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix="${2:?--prefix needs a directory}"; use_venv=1; shift 2 ;;
        --prefix=*) prefix="${1#*=}"; use_venv=1; shift ;;
        --venv) use_venv=1; shift ;;
        --from) spec="${2:?--from needs a package spec}"; shift 2 ;;
        --from=*) spec="${1#*=}"; shift ;;
        --no-service|--no-systemctl) use_service=0; shift ;;
        --unit-dir) unit_dir="${2:?--unit-dir needs a directory}"; shift 2 ;;
        --unit-dir=*) unit_dir="${1#*=}"; shift ;;
        --agent-dir) agent_dir="${2:?--agent-dir needs a directory}"; shift 2 ;;
        --agent-dir=*) agent_dir="${1#*=}"; shift ;;
        --config) config="${2:?--config needs a file}"; shift 2 ;;
        --config=*) config="${1#*=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown option: $1" >&2; usage >&2; exit 2 ;;
    esac
done

case "$(uname -s)" in
    Darwin) platform=macos ;;
    *) platform=linux ;;
esac

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

# A value for a sed replacement inside XML text: XML-escaped, then sed-escaped.
plist_value() {
    printf '%s\n' "$1" | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' \
                             -e 's/[\\|&]/\\&/g'
}

# 3. The service, pointing at the installed command; started unless --no-service.
started=0
if [ "$platform" = macos ]; then
    uid="$(id -u)"
    domain="gui/$uid"
    plist="$agent_dir/$label.plist"
    mkdir -p "$agent_dir"
    # Private: the log names the sessions' project paths.
    mkdir -p "$log_dir"
    chmod 700 "$log_dir"
    sed -e "s|@SYNCD@|$(plist_value "$bin")|g" -e "s|@HOME@|$(plist_value "$HOME")|g" \
        "$here/launchd/$label.plist" >"$plist"
    # launchd refuses a plist that others may write.
    chmod 644 "$plist"
    echo "wrote $plist"
    if [ "$use_service" = 1 ]; then
        if ! command -v launchctl >/dev/null 2>&1; then
            echo "launchctl not found: the agent was not started" >&2
        elif ! launchctl print "$domain" >/dev/null 2>&1; then
            echo "no launchd session $domain (logged in over ssh only?): the agent was" \
                 "not started" >&2
        else
            # An earlier install may be running: unload it (not loaded yet is fine).
            launchctl bootout "$domain/$label" 2>/dev/null || true
            # A label someone disabled cannot be bootstrapped.
            launchctl enable "$domain/$label" || true
            # bootout returns before launchd lets go of the label (the old daemon first
            # finishes its segment in flight, up to the plist's ExitTimeOut of 90 s);
            # until then bootstrap fails with "5: Input/output error". Keep trying.
            tries=0
            until launchctl bootstrap "$domain" "$plist" 2>/dev/null; do
                tries=$((tries + 1))
                if [ "$tries" -ge 100 ]; then
                    # Once more, showing launchd's reason; set -e ends the script on it.
                    launchctl bootstrap "$domain" "$plist"
                    break
                fi
                sleep 1
            done
            started=1
            echo "started $label: launchctl print $domain/$label"
        fi
    fi
else
    mkdir -p "$unit_dir"
    case "$bin" in
        *'"'*|*'\'*)
            echo "install.sh: systemd cannot run a program whose path holds a quote or a" \
                 "backslash ($bin): install with --prefix DIR elsewhere" >&2
            exit 2 ;;
    esac
    # For systemd: in double quotes (a space in the path), % doubled (its specifiers);
    # then escaped for sed's replacement.
    exec_start="$(printf '"%s" run\n' "$bin" | sed -e 's/%/%%/g' -e 's/[\\|&]/\\&/g')"
    sed "s|^ExecStart=.*|ExecStart=$exec_start|" "$repo/systemd/syncd.service" \
        >"$unit_dir/syncd.service"
    echo "wrote $unit_dir/syncd.service"
    if command -v systemctl >/dev/null 2>&1 && systemctl --user show-environment >/dev/null 2>&1
    then
        user_manager=1
    fi
    if [ "$use_service" = 1 ]; then
        if [ "$user_manager" = 1 ]; then
            systemctl --user daemon-reload
            systemctl --user enable syncd.service
            # Restart, not start: a run of this script that upgraded the package must
            # not leave the old code running (a stop lets the flush in flight finish).
            systemctl --user restart syncd.service
            systemctl --user --no-pager status syncd.service | head -n 5 || true
            started=1
        else
            echo "no systemd user manager reachable: the service was not started" >&2
        fi
    fi
fi

# 4. What is left to do.
case ":$PATH:" in
    *":$(dirname "$bin"):"*) ;;
    *) echo "note: $(dirname "$bin") is not on your PATH" ;;
esac
if [ "$started" = 0 ]; then
    echo "to start it:"
    if [ "$platform" = macos ]; then
        printf '  launchctl bootstrap %s %q\n' "$domain" "$plist"
        echo "  (an older one still loaded: launchctl bootout $domain/$label first)"
    else
        echo "  systemctl --user daemon-reload && systemctl --user enable --now syncd"
    fi
    printf '  or run it in a terminal: %q run\n' "$bin"
fi
if [ "$platform" = linux ] && command -v loginctl >/dev/null 2>&1 \
        && { [ "$user_manager" = 1 ] || [ -d /run/systemd/system ]; }; then
    linger="$(loginctl show-user "$(id -un)" --property=Linger --value 2>/dev/null || true)"
    if [ "$linger" != "yes" ]; then
        echo "to keep backing up while you are logged out: loginctl enable-linger $(id -un)"
    fi
fi
echo "check it with: syncd status"
if [ "$platform" = macos ]; then
    echo "logs: $log_dir/syncd.log"
else
    echo "logs: journalctl --user -u syncd"
fi

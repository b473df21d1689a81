#!/usr/bin/env bash
# Install syncd for the current user: the package, a starter config, and the service
# (a systemd user unit on Linux, with a drop-in making the Claude tree, state and a local
# store writable where they lie outside its defaults; a launchd user agent on macOS).
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
case "$config" in
    /*) ;;
    *) config="$PWD/$config" ;;
esac

# The service gets none of this shell's environment: the variables that decide syncd's
# paths are passed on to it as they are here (the unit's drop-in, the plist), so that it
# backs up the Claude tree Claude Code uses and reads the config written below.
pins=()
for var in CLAUDE_CONFIG_DIR XDG_CONFIG_HOME XDG_STATE_HOME XDG_DATA_HOME; do
    value="$(printenv "$var" || true)"
    if [ -n "$value" ]; then
        pins+=("$var=$value")
    fi
done
if [ "$config" != "${XDG_CONFIG_HOME:-$HOME/.config}/syncd/config.toml" ]; then
    pins+=("SYNCD_CONFIG=$config")
fi
for pin in ${pins[@]+"${pins[@]}"}; do
    case "$pin" in
        *[[:cntrl:]]*)
            echo "install.sh: ${pin%%=*} holds a control character: a service cannot be" \
                 "given it" >&2
            exit 2 ;;
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

# A value for a sed replacement inside XML text: XML-escaped, then sed-escaped.
plist_value() {
    printf '%s\n' "$1" | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' \
                             -e 's/[\\|&]/\\&/g'
}

# What the service's syncd resolves, one a line: the Claude tree, the state directory,
# a local store's directory (empty for S3) and the other trees of `sources`. Asked of `syncd status --json` in the
# environment the service gets (the shell's SYNCD_* variables do not reach it).
resolved_paths() {
    env -i HOME="$HOME" PATH="$PATH" ${pins[@]+"${pins[@]}"} "$bin" status --json \
        | "$python" -c '
import json, os, sys
from urllib.parse import unquote, urlparse
s = json.load(sys.stdin)
store = urlparse(s["store"])
paths = [s["source"], os.path.dirname(s["state"]),
         unquote(store.path) if store.scheme == "file" else ""]
paths += [t["source"] for t in s.get("sources", [])]  # the other Claude trees (sources)
if any("\n" in p for p in paths):
    sys.exit("a path holds a newline")
print("\n".join(paths))
'
}

# $1 under the directory $2 (or $2 itself)?
under() {
    case "$1/" in
        "$2"/*) return 0 ;;
    esac
    return 1
}

# A value for a unit file line: in double quotes, % doubled (systemd's specifiers), and $
# doubled too for a command line ($2 = exec: its variables). A quote, a backslash or a
# control character has no spelling a drop-in can hold: refused.
unit_quote() {
    case "$1" in
        *'"'*|*'\'*|*[[:cntrl:]]*)
            echo "install.sh: systemd cannot be given a value holding a quote, a backslash" \
                 "or a control character: $1" >&2
            exit 2 ;;
    esac
    if [ "${2:-}" = exec ]; then
        printf '"%s"' "$1" | sed -e 's/%/%%/g' -e 's/\$/$$/g'
    else
        printf '"%s"' "$1" | sed -e 's/%/%%/g'
    fi
}

# The unit's drop-in for what lies outside its defaults: the pinned variables, and each
# resolved path elsewhere than ~/.claude, ~/.local/state/syncd, ~/.local/share/syncd made
# writable (ReadWritePaths=; it must exist when the service starts: ExecStartPre= makes
# it). Printed to stdout; empty when the defaults cover everything.
dropin_text() {
    local paths="$1" writable="" made="" p
    while IFS= read -r p; do
        [ -n "$p" ] || continue
        case "$p" in
            /*) ;;
            *)
                echo "install.sh: not an absolute path, left read-only to the service: $p" >&2
                continue ;;
        esac
        if under "$p" "$HOME/.claude" || under "$p" "$HOME/.local/state/syncd" \
                || under "$p" "$HOME/.local/share/syncd"; then
            continue
        fi
        # (Command substitutions do not inherit set -e: a refusal is passed on by hand.)
        writable="$writable $(unit_quote "$p")" || exit 2
        made="$made $(unit_quote "$p" exec)" || exit 2
    done <<EOF_PATHS
$paths
EOF_PATHS
    if [ -z "$writable" ] && [ -z "${pins[0]+set}" ]; then
        return 0
    fi
    echo "# Written by deploy/install.sh: what this installation's syncd resolved outside the"
    echo "# unit's defaults. Run install.sh again after moving the Claude tree, state_dir or a"
    echo "# local store; changes of your own go in another file (systemctl --user edit syncd)."
    echo "[Service]"
    for pin in ${pins[@]+"${pins[@]}"}; do
        pin="$(unit_quote "$pin")" || exit 2
        echo "Environment=$pin"
    done
    if [ -n "$writable" ]; then
        echo "ExecStartPre=+mkdir -p --$made"
        echo "ReadWritePaths=${writable# }"
    fi
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
    environment=""
    for pin in ${pins[@]+"${pins[@]}"}; do
        environment="$environment<key>$(plist_value "${pin%%=*}")</key><string>$(plist_value "${pin#*=}")</string>"
    done
    sed -e "s|@SYNCD@|$(plist_value "$bin")|g" -e "s|@HOME@|$(plist_value "$HOME")|g" \
        -e "s|<!-- @ENVIRONMENT@ -->|$environment|" \
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
    dropin="$unit_dir/syncd.service.d/paths.conf"
    if ! paths="$(resolved_paths)"; then
        if [ -e "$dropin" ]; then
            echo "install.sh: could not ask $bin for the paths it uses (above): $dropin" \
                 "was left as it was" >&2
        else
            echo "install.sh: could not ask $bin for the paths it uses (above): the" \
                 "service can write only the unit's defaults" >&2
        fi
    else
        text="$(dropin_text "$paths")" || exit 2
        if [ -n "$text" ]; then
            mkdir -p "$(dirname "$dropin")"
            printf '%s\n' "$text" >"$dropin"
            echo "wrote $dropin"
        elif [ -e "$dropin" ]; then
            rm -f "$dropin"
            rmdir "$(dirname "$dropin")" 2>/dev/null || true
            echo "removed $dropin: the unit's defaults cover every path"
        fi
    fi
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

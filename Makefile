# The two commands of the README. Both bootstrap first (idempotent, fast when done).
.PHONY: demo test test-fast lint bench

# The suite mostly waits (timers, Chromium, servers), so it can run in parallel: pytest-xdist with
# more workers than cores; tests/support/xdist.py groups and orders the tests. Not the default yet:
# the first parallel run (on a machine loaded far beyond its 2 cores) failed 14 of its first 72
# tests, the slow ones that start together (notes/speed.md). Opt in: make test PARALLEL="-n 4 --dist loadgroup"
PARALLEL ?=

demo:
	@scripts/bootstrap.sh
	@.venv/bin/busscrape demo

test:
	@scripts/bootstrap.sh test
	@.venv/bin/ruff check src tests bench
	@BUSSCRAPE_REQUIRE_POSTGRES=1 .venv/bin/python -m pytest -q -ra $(PARALLEL)  # CI must not skip the PostgreSQL tests

# The edit-test loop: everything but the slow and the browser tests.
test-fast:
	@scripts/bootstrap.sh test
	@.venv/bin/python -m pytest -q -ra $(PARALLEL) -m "not slow and not browser"

lint:
	@.venv/bin/ruff check src tests bench

# The two commands of the README. Both bootstrap first (idempotent, fast when done).
.PHONY: demo test lint bench docs

demo:
	@scripts/bootstrap.sh
	@.venv/bin/busscrape demo

test:
	@scripts/bootstrap.sh test
	@.venv/bin/ruff check src tests bench
	@$(MAKE) --no-print-directory docs
	@.venv/bin/mypy  # strict, on src/ ([tool.mypy] in pyproject.toml)
	@BUSSCRAPE_REQUIRE_POSTGRES=1 .venv/bin/python -m pytest -q -ra  # CI must not skip the PostgreSQL tests
	@scripts/compat-newest.sh  # bus/compat.py's tests against the newest nats-py release, in a throwaway venv

lint:
	@.venv/bin/ruff check src tests bench

# The documentation site, built strictly (a broken link, a missing page or a stale generated
# reference fails it) into a temporary folder; `.venv/bin/mkdocs serve` to read it instead.
docs:
	@site="$$(mktemp -d)"; NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$$site"; \
	  status=$$?; rm -rf "$$site"; exit $$status

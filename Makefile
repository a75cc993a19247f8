# The two commands of the README. Both bootstrap first (idempotent, fast when done).
.PHONY: demo test lint bench

demo:
	@scripts/bootstrap.sh
	@.venv/bin/busscrape demo

test:
	@scripts/bootstrap.sh test
	@.venv/bin/ruff check src tests bench
	@.venv/bin/mypy  # strict, on src/ ([tool.mypy] in pyproject.toml)
	@BUSSCRAPE_REQUIRE_POSTGRES=1 .venv/bin/python -m pytest -q -ra  # CI must not skip the PostgreSQL tests
	@scripts/compat-newest.sh  # bus/compat.py's tests against the newest nats-py release, in a throwaway venv

lint:
	@.venv/bin/ruff check src tests bench

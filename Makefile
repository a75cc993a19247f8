# The two commands of the README. Both bootstrap first (idempotent, fast when done).
.PHONY: demo test lint bench

demo:
	@scripts/bootstrap.sh
	@.venv/bin/busscrape demo

test:
	@scripts/bootstrap.sh test
	@.venv/bin/ruff check src tests bench
	@.venv/bin/python -m pytest -q -ra

lint:
	@.venv/bin/ruff check src tests bench

"""What a user who got something wrong is told, through the real entry point: the variable or flag,
the value, the reason; exit 2; never pydantic's report or a traceback."""

from __future__ import annotations

import pytest

from tests.support.cli import busscrape, clean_env

COMMANDS = [["status"], ["dispatch", "-"], ["run", "-"], ["worker"], ["ingester"], ["config"], ["dlq", "list"],
            ["task", "http://example.com/"], ["search", "x"], ["api"], ["streams", "show"]]


def assert_told(result, *lines: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    for line in lines:
        assert f"error: {line}\n" in result.stderr, result.stderr
    assert "pydantic" not in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
def test_every_command_names_the_variable_the_value_and_the_reason(command):
    result = busscrape(*command, env=clean_env(BUSSCRAPE_WORKER__CONCURRENCY="abc"), stdin="")
    assert_told(result, "BUSSCRAPE_WORKER__CONCURRENCY='abc': not an integer")


@pytest.mark.parametrize(("env", "line"), [
    ({"BUSSCRAPE_WORKER__CONCURRENCY": "0"}, "BUSSCRAPE_WORKER__CONCURRENCY='0': must be at least 1"),
    ({"BUSSCRAPE_TELEMETRY__LOG_FORMAT": "xml"},
     "BUSSCRAPE_TELEMETRY__LOG_FORMAT='xml': not one of 'auto', 'json' or 'console'"),
    ({"BUSSCRAPE_S3__SECURE": "maybe"}, "BUSSCRAPE_S3__SECURE='maybe': not a boolean (true or false)"),
    ({"BUSSCRAPE_NATS__CONNECT_TIMEOUT": "soon"},
     "BUSSCRAPE_NATS__CONNECT_TIMEOUT='soon': not a duration (use e.g. 250ms, 30s, 5m, 1h30m, 7d)"),
    ({"BUSSCRAPE_WORKER__CONCURENCY": "3"}, "BUSSCRAPE_WORKER__CONCURENCY='3': no such setting"),
    ({"BUSSCRAPE_NETWORK__ALLOW": "[127.0.0.2/32"},
     "BUSSCRAPE_NETWORK__ALLOW='[127.0.0.2/32': starts with [ but is not a JSON array (Expecting ',' delimiter)"),
    ({"BUSSCRAPE_NETWORK": "allow=x"},
     "BUSSCRAPE_NETWORK='allow=x': not a JSON object; set each value on its own (BUSSCRAPE_NETWORK__<SETTING>=…)"),
])
def test_each_kind_of_bad_setting_is_said_in_a_few_words(env, line):
    assert_told(busscrape("status", env=clean_env(**env)), line)


def test_every_bad_setting_is_named_at_once():
    result = busscrape("status", env=clean_env(BUSSCRAPE_WORKER__CONCURRENCY="abc", BUSSCRAPE_S3__SECURE="maybe"))
    assert_told(result, "BUSSCRAPE_WORKER__CONCURRENCY='abc': not an integer",
                "BUSSCRAPE_S3__SECURE='maybe': not a boolean (true or false)")


def test_a_bad_flag_value_names_the_flag():
    assert_told(busscrape("worker", "--exit-when-idle", "soon"),
                "--exit-when-idle 'soon': not a duration (use e.g. 250ms, 30s, 5m, 1h30m, 7d)")
    assert_told(busscrape("dispatch", "-", "--recrawl-after", "soon", stdin=""),
                "--recrawl-after 'soon': not a duration (use e.g. 250ms, 30s, 5m, 1h30m, 7d)")


@pytest.mark.parametrize(("steps", "line"), [
    ("nope", "--steps 'nope': not valid JSON (expected ident at line 1 column 2); write a JSON list of steps or @FILE"),
    ('{"action": "sleep"}', """--steps '{"action": "sleep"}': not a list; write a list of steps"""),
    ('[{"action": "scroll", "mode": "sideways"}]',
     """--steps '[{"action": "scroll", "mode": "sideways"}]': step 1 mode: not one of 'bottom' or 'infinite'"""),
    ('[{"selector": "#a"}]', """--steps '[{"selector": "#a"}]': step 1: no action; write "action": one of 'goto', """
                             "'wait_for', 'click'"),
    ('[{"action": "hover"}]', """--steps '[{"action": "hover"}]': step 1: action 'hover' is not one of 'goto', """),
    ('[{"action": "click", "selector": "#a", "force": 1}]',
     """--steps '[{"action": "click", "selector": "#a", "force": 1}]': step 1 force: not a field of this action"""),
])
def test_steps_errors_name_the_step_the_field_and_what_is_accepted(steps, line):
    result = busscrape("dispatch", "-", "--steps", steps, stdin="")
    assert result.returncode == 2 and line in result.stderr, result.stderr
    assert "(message)" not in result.stderr and "Input should" not in result.stderr
    assert "Unable to extract tag" not in result.stderr and "Invalid JSON" not in result.stderr


def test_task_with_a_bad_spec_blames_the_spec_not_the_url():
    result = busscrape("task", "https://example.com/", "--spec", '{"artifacts": ["htm"]}')
    assert_told(result, "--spec: artifacts.0: not one of 'html', 'screenshot', 'har', 'text' or 'warc' (got 'htm')")
    assert "Input should" not in result.stderr
    assert "reject it as a URL" not in result.stderr


def test_task_with_a_bad_url_and_a_bad_spec_blames_the_url():
    result = busscrape("task", "ftp://example.com/", "--spec", '{"artifacts": ["htm"]}')
    assert result.returncode == 2
    assert "unsupported_scheme" in result.stderr and "artifacts" not in result.stderr


@pytest.mark.parametrize(("flags", "line"), [
    (["--format", "jsonl"], "--format is not for `busscrape crawl`: a crawl's input is its SEED arguments, "
                            "not a file of URL lines"),
    (["--rejects", "r.jsonl"], "--rejects is not for `busscrape crawl`: a crawl rejects no input line: its "
                               "skipped links are counted by reason in its summary"),
    (["--strict"], "--strict is not for `busscrape crawl`: a crawl rejects no input line (a bad seed already "
                   "stops it with exit 2)"),
    (["--force"], "--force is not for `busscrape crawl`: a crawl queues each page once per crawl id; change a "
                  "rule or an option to crawl again"),
])
def test_crawl_refuses_the_flags_about_a_list_of_url_lines(tmp_path, flags, line):
    assert_told(busscrape("crawl", "http://127.0.0.2/", *flags, cwd=tmp_path), line)
    assert not (tmp_path / "r.jsonl").exists()  # refused before anything ran

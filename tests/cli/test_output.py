"""Output off a terminal (a pipe, as here): no wrapping, no truncation, no padding to a width."""

from __future__ import annotations

import re

from tests.support.cli import busscrape, clean_env


def piped_env(**extra: str) -> dict[str, str]:
    env = clean_env(**extra)
    env.pop("COLUMNS", None)  # what rich would otherwise fall back to: 80
    return env


def variables_in_reference() -> list[str]:
    reference = busscrape("config", "--markdown", env=piped_env()).stdout
    return re.findall(r"^\| `(BUSSCRAPE_[A-Z_]+)`", reference, flags=re.M)


def test_config_shows_every_name_value_and_meaning_whole():
    result = busscrape("config", env=piped_env(BUSSCRAPE_DISPATCH__TRACKING_PARAMS="utm_*,ref," + "x" * 60))
    assert result.returncode == 0, result.stderr
    rows = {line.split()[1]: line for line in result.stdout.splitlines() if line.startswith("│ BUSSCRAPE_")}
    assert set(variables_in_reference()) <= set(rows)  # BUSSCRAPE_NATS__PASSWORD, not BUSSCRAPE_NATS__PASSWO…
    assert "x" * 60 in rows["BUSSCRAPE_DISPATCH__TRACKING_PARAMS"]  # the value whole
    assert ("Parameter names (``*`` wildcard) that ``strip_tracking`` removes, comma-separated (``utm_*,ref``) or a "
            "JSON array.") in rows["BUSSCRAPE_DISPATCH__TRACKING_PARAMS"]  # the meaning whole, on its row
    assert not re.search(r"…\s*│", result.stdout)  # no cell cut short


def test_a_long_error_stays_on_one_line(tmp_path):
    path = tmp_path / ("deep-" * 30) / "rejects.jsonl"
    result = busscrape("dispatch", "-", "--rejects", str(path), env=piped_env(), stdin="")
    assert result.returncode == 2
    assert f"error: --rejects {path}: No such file or directory\n" in result.stderr


async def test_streams_show_and_status_keep_names_and_cells_whole(applied, nats_url):
    env = piped_env(BUSSCRAPE_NATS__URL=nats_url)
    shown = busscrape("streams", "show", env=env)
    assert shown.returncode == 0, shown.stderr
    assert ("retention=workqueue, compression=s2, discard=old, max_age=14d, duplicate_window=10m, sources=KV_SEEN"
            in shown.stdout)
    status = busscrape("status", env=env)
    assert status.returncode == 0, status.stderr
    assert "TASK_ADVISORIES/reaper" in status.stdout and "…" not in status.stdout
    assert "from the JetStream API" in next(line for line in status.stdout.splitlines() if "lag" in line)
    for output in (shown.stdout, status.stdout):
        assert not [line for line in output.splitlines() if line != line.rstrip()]  # nothing padded

"""``--config FILE`` (one file for a whole run or crawl) and ``-o FILE`` (the dataset), through
the real command: a real embedded nats-server, Chromium and ingester where a run happens, the
datasets read back by DuckDB."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

import busscrape
from tests.support import crawl_site, pages
from tests.support.cli import busscrape as cli
from tests.support.cli import clean_env


def settings_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_env(BUSSCRAPE_STATE_DIR=str(tmp_path / "state"), **extra)


# -- the file, without running anything ---------------------------------------------------------

def test_file_keys_are_the_options_and_flags_then_variables_beat_the_file(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    crawl_yaml = tmp_path / "conf" / "crawl.yaml"
    crawl_yaml.write_text("seeds: [http://127.0.0.2/]\nscope: domain\nmax-pages: 7\ndepth: 5\ninclude: /a/\n"
                          "archive: out\nconcurrency: 3\nsteps: [{action: wait_for, selector: '#app'}]\n"
                          "settings:\n  worker: {host_concurrency: 2, concurrency: 9}\n  archive: {prefix: p}\n")
    monkeypatch.setenv("BUSSCRAPE_WORKER__CONCURRENCY", "4")
    planned = busscrape.crawl(config=str(crawl_yaml), depth=1)
    spec = planned.options.crawl
    assert (spec.seeds, spec.scope, spec.max_pages, spec.include) == (("http://127.0.0.2/",), "domain", 7, ("/a/",))
    assert spec.depth == 1  # the argument (a flag) beats the file
    assert planned.settings.worker.concurrency == 4  # the variable beats the file's option and its settings table
    assert planned.settings.worker.host_concurrency == 2 and planned.settings.archive.prefix == "p"
    assert planned.settings.archive.dir == tmp_path / "conf" / "out"  # relative to the file's folder
    [step] = planned.options.defaults.steps
    assert (step.action, step.selector) == ("wait_for", "#app")


def test_a_toml_file_gives_run_its_input_as_a_list(tmp_path):
    run_toml = tmp_path / "run.toml"
    run_toml.write_text('input = ["http://127.0.0.2/a", {url = "http://127.0.0.2/b", extractor = "x"}]\n'
                        'output = "pages.parquet"\nworkers = 1\n[settings.dispatch]\nstrip_tracking = true\n')
    planned = busscrape.run(config=str(run_toml))
    lines = [json.loads(line) for line in Path(planned.options.source).read_text().splitlines()]
    assert lines == [{"url": "http://127.0.0.2/a"}, {"url": "http://127.0.0.2/b", "extractor": "x"}]
    assert planned.options.output == str(tmp_path / "pages.parquet") and planned.options.workers == 1
    assert planned.settings.dispatch.strip_tracking is True


@pytest.mark.parametrize(("text", "said"), [
    ("depht: 3\n", "crawl.yaml: unknown key 'depht' (value 3)"),
    ("depth: deep\n", "crawl.yaml: depth='deep': not an integer"),
    ("depth: -1\n", "crawl.yaml: depth=-1: must be at least 0"),
    ("scope: bogus\n", "crawl.yaml: scope='bogus': must be one of 'page', 'prefix', 'host', 'domain' or 'any'"),
    ("max_pages: 0\n", "crawl.yaml: max_pages=0: must be at least 1"),
    ("include: ['(']\n", "crawl.yaml: include=['(']: '(' is not a regular expression: missing ) at position 1"),
    ("exclude: '[a'\n", "crawl.yaml: exclude='[a': '[a' is not a regular expression"),
    ("sitemap_since: yesterday\n", "crawl.yaml: sitemap_since='yesterday': must be an ISO 8601 date or time"),
    ("steps: [{action: fill, value: x}]\n", "crawl.yaml: steps=[{'action': 'fill', 'value': 'x'}]: step 1 selector: "
                                            "required"),
    ("steps: [{action: 'on: hover'}]\n", "crawl.yaml: steps=[{'action': 'on: hover'}]: step 1: action 'on: hover' "
                                          "is not one of 'goto', 'wait_for'"),
    ("steps: 'not json'\n", "crawl.yaml: steps='not json': not valid JSON"),
    ("extractor: nope\n", "crawl.yaml: extractor='nope': no extractor 'nope'"),
    ("output: pages.xlsx\n", "crawl.yaml: output='pages.xlsx' ({dir}/pages.xlsx): write a .jsonl, .csv or .parquet "
                              "file"),
    ("viewport: 12\n", "crawl.yaml: viewport=12: write WIDTHxHEIGHT"),
    ("label: [nolabel]\n", "crawl.yaml: label=['nolabel'] ('nolabel'): write KEY=VALUE"),
    ("robots: maybe\n", "crawl.yaml: robots='maybe': "),
    ("settings: {worker: {host_concurency: 2}}\n", "unknown setting settings.worker.host_concurency (value 2)"),
    ("settings: {worker: {host_concurrency: many}}\n", "crawl.yaml: settings.worker.host_concurrency='many'"),
    ("settings: {wrker: {a: 1}}\n", "unknown settings section 'wrker'"),
    ("[unclosed\n", "crawl.yaml: not valid YAML"),
])
def test_an_unknown_key_or_a_bad_value_is_exit_2_naming_file_key_and_value(tmp_path, text, said):
    (tmp_path / "crawl.yaml").write_text("seeds: [http://127.0.0.2/]\n" + text)
    done = cli("crawl", "--config", "crawl.yaml", cwd=tmp_path, env=settings_env(tmp_path))
    assert done.returncode == 2, done.stderr
    assert said.replace("{dir}", str(tmp_path)) in done.stderr and done.stdout == ""
    assert "Input should" not in done.stderr and "Value error" not in done.stderr


@pytest.mark.parametrize(("text", "said"), [
    ("seeds: ['not a url']\n", "crawl.yaml: seeds=['not a url'] ('not a url'): whitespace ' ' at position 3"),
    ("seeds: [http://127.0.0.2/, 'ftp://127.0.0.2/']\n", "crawl.yaml: seeds=['http://127.0.0.2/', "
                                                        "'ftp://127.0.0.2/'] ('ftp://127.0.0.2/'): "),
])
def test_a_bad_seed_in_the_file_is_named_with_the_file_and_the_key(tmp_path, text, said):
    (tmp_path / "crawl.yaml").write_text(text)
    done = cli("crawl", "--config", "crawl.yaml", cwd=tmp_path, env=settings_env(tmp_path))
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_a_missing_input_is_named_as_the_file_wrote_it_and_where_that_is(tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "run.yaml").write_text("input: urls.txt\n")
    done = cli("run", "--config", "job/run.yaml", cwd=tmp_path, env=settings_env(tmp_path))
    assert done.returncode == 2
    assert f"job/run.yaml: input='urls.txt' ({tmp_path}/job/urls.txt): No such file or directory" in done.stderr


def test_a_flag_given_beside_the_file_is_named_as_the_flag(tmp_path):
    (tmp_path / "crawl.yaml").write_text("seeds: [http://127.0.0.2/]\nscope: host\n")
    done = cli("crawl", "--config", "crawl.yaml", "--scope", "bogus", cwd=tmp_path, env=settings_env(tmp_path))
    assert done.returncode == 2
    assert "error: --scope 'bogus': must be one of" in done.stderr and "crawl.yaml" not in done.stderr


def test_parquet_without_pyarrow_is_one_line_and_exit_2(tmp_path):
    blocker = tmp_path / "blocker" / "pyarrow"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('blocked by the test')\n")
    (tmp_path / "urls.txt").write_text("http://127.0.0.2/\n")
    import os

    env = settings_env(tmp_path, PYTHONPATH=f"{blocker.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    done = cli("run", "urls.txt", "-o", "pages.parquet", cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --output pages.parquet: Parquet needs pyarrow (pip install 'busscrape[export]'); or write .jsonl "
        "or .csv"]


# -- real runs ------------------------------------------------------------------------------------

def allow(site) -> str:
    return json.dumps([f"{h}/32" for h in site.hosts])


@pytest.mark.browser
@pytest.mark.slow
def test_run_from_a_toml_file_writes_parquet_and_csv_duckdb_reads(tmp_path, site):
    pages.install(site)
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "run.toml").write_text(
        f'input = ["{site.url("/static")}", "{site.url("/status?code=404")}"]\noutput = "out/pages.parquet"\n'
        f"workers = 1\nallow = {json.dumps([f'{h}/32' for h in site.hosts])}\n")
    done = cli("run", "--config", "job/run.toml", cwd=tmp_path, env=settings_env(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    parquet = tmp_path / "job" / "out" / "pages.parquet"  # relative to the file
    assert not Path(str(parquet) + ".jsonl.partial").exists()
    rows = duckdb.sql(f"select url, final_url, status, title, dead_reason, task_id is not null, "
                      f"archived_at is not null, folder is not null from '{parquet}' order by url").fetchall()
    assert rows == [(site.url("/static"), site.url("/static"), 200, "Static page", None, True, True, True),
                    (site.url("/status?code=404"), None, None, None, "http_404", True, True, False)]
    # The same input again into a CSV: nothing new to do, no row; a new URL: its row, extracted as text.
    (tmp_path / "urls.txt").write_text(site.url("/js") + "\n")
    done = cli("run", "urls.txt", "--workers", "1", "-o", "pages.csv", "--allow", f"{site.hosts[0]}/32",
               cwd=tmp_path, env=settings_env(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = duckdb.sql(f"select url, status, title, extracted from read_csv('{tmp_path}/pages.csv')").fetchall()
    assert rows == [(site.url("/js"), 200, "JS page", None)]


@pytest.mark.browser
@pytest.mark.slow
def test_crawl_from_stdin_yaml_writes_only_jsonl_to_stdout(tmp_path, site):
    crawl_site.install(site)
    config = (f"seeds: ['{site.url('/')}']\ndepth: 1\nmax_pages: 3\nrobots: ignore\nworkers: 1\n"
              f"allow: {allow(site)}\njson: true\nextractor: title\n")
    extractors = tmp_path / "extractors"
    extractors.mkdir()
    (extractors / "title.toml").write_text('version = 1\n[fields.heading]\ncss = "title"\n')
    done = cli("crawl", "--config", "-", "-o", "-", cwd=tmp_path, stdin=config,
               env=settings_env(tmp_path, BUSSCRAPE_EXTRACT__DIR=str(extractors)), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (tmp_path / "stdout.jsonl").write_text(done.stdout)
    rows = duckdb.sql(f"select url, status, extracted.heading from read_json_auto('{tmp_path}/stdout.jsonl')"
                      ).fetchall()
    assert len(rows) == 3 and rows[0] == (site.url("/"), 200, "index")
    assert all(line.startswith('{"url":') for line in done.stdout.splitlines())  # rows, nothing else
    summary = json.loads(done.stderr.strip().splitlines()[-1])  # --json's summary went to stderr
    assert summary["archived"] == 3 and summary["crawl"]["crawl_id"]

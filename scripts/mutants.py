#!/usr/bin/env python3
"""The mutation table: break each guarantee in the line that holds it, and check a test fails.

Each mutant is one or more textual edits (file, exact old text, new text). For each: apply the
edits, run the named tests with pytest, expect a failure ("killed"), restore the files — always,
also on Ctrl-C or when pytest itself cannot start. A mutant whose old text is not found fails
loudly (the code moved: update the pattern), it is never counted as killed.

    scripts/mutants.py                 every mutant, then the table
    scripts/mutants.py --only NAME     one (repeat --only for several)
    scripts/mutants.py --list          names, guarantees and tests, without running anything
    scripts/mutants.py --check         only check that every pattern still applies (fast)
    scripts/mutants.py --baseline      run each mutant's tests unbroken first (twice as long)

Exit code: 0 when every mutant run was killed, 1 when one survived, 2 when a pattern is stale.
The table (mutant, test, killed/survived, seconds) is docs/testing/mutations.md's source.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = "src/busscrape/"


@dataclass(frozen=True)
class Edit:
    file: str  # under src/busscrape/
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    guarantee: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]
    timeout: float = 900.0
    notes: str = field(default="")


def m(name: str, guarantee: str, file: str, old: str, new: str, *tests: str, **extra) -> Mutant:
    return Mutant(name, guarantee, (Edit(file, old, new),), tests, **extra)


T_DAEMON = "tests/worker/test_daemon.py"
T_POLITE = "tests/worker/test_politeness.py"
T_FRONT = "tests/crawl/test_frontier.py"
T_WARC = "tests/worker/test_warc.py"
T_SESS = "tests/worker/test_sessions.py"

MUTANTS: tuple[Mutant, ...] = (
    # -- the ten guarantees -------------------------------------------------------------------------
    m("ack_before_publish", "ack after publish", "worker/daemon.py",
      "stands = await self.results.publish(task, result)",
      "stands = True; asyncio.ensure_future(self.results.publish(task, result))",
      "tests/worker/test_backpressure.py"),
    Mutant("meta_json_first", "meta.json last", (Edit(
        "ingest/archiver.py",
        "            if existing is None:\n                stored = await self._write(plan)",
        "            if existing is None:\n                await self.storage.put_bytes(plan.meta_key, "
        "layout.meta_document(result, []), content_type=JSON)\n                stored = await self._write(plan)"),),
        ("tests/ingest/test_daemon.py",)),
    m("seen_put_not_create", "first-writer-wins create (dispatch)", "dispatch/dispatcher.py",
      'headers[names.EXPECTED_LAST_SUBJECT_SEQUENCE] = "0"', "pass",
      "tests/dispatch/test_dispatcher.py"),
    m("frontier_put_not_create", "first-writer-wins create (crawl links)", "crawl/frontier.py",
      'headers = {names.EXPECTED_LAST_SUBJECT_SEQUENCE: "0", names.MSG_TTL: self._ttl}',
      "headers = {names.MSG_TTL: self._ttl}",
      f"{T_FRONT}::test_the_same_link_found_by_two_workers_at_once_is_one_task"),
    m("budget_put_not_cas", "exact budget", "crawl/state.py",
      "await kv.update(key, value, last=revision)", "await kv.put(key, value)",
      f"{T_FRONT}::test_max_pages_is_exact_across_workers"),
    m("budget_one_over", "exact budget", "crawl/state.py",
      "min(wanted, limit - used)", "min(wanted, limit - used + 1)",
      f"{T_FRONT}::test_max_pages_is_exact_across_workers"),
    m("budget_put_not_cas_fleet", "exact budget (crawl --max-pages, two workers racing)", "crawl/state.py",
      "await kv.update(key, value, last=revision)", "await kv.put(key, value)",
      "tests/e2e/test_crawl.py::test_max_pages_holds_when_pages_on_two_workers_race_for_the_last_slots"),
    m("slots_per_worker", "fleet host limits", "worker/fleet_gate.py",
      'key = f"slot.{token}.{(first + i) % limit.concurrency}"',
      'key = f"slot.{token}.{(first + i) % limit.concurrency}.{self.holder.hex()}"',
      f"{T_POLITE}::test_slots_are_shared_by_every_gate_and_free_again_on_release",
      f"{T_POLITE}::test_two_slots_on_a_host_without_a_delay_are_two_pages_at_once_never_more"),
    m("egress_admits_all", "SSRF on every hop", "net/policy.py",
      "refusal = self.refusal(host, ip, port)", "refusal = None",
      "tests/net/test_egress.py"),
    m("leases_put_not_create", "leases (slots exclusive)", "bus/leases.py",
      "return await kv.create(key, value), value", "return await kv.put(key, value), value",
      f"{T_POLITE}::test_two_slots_on_a_host_without_a_delay_are_two_pages_at_once_never_more"),
    m("lease_not_renewed", "leases (renewed while held)", "bus/leases.py",
      "await asyncio.sleep(self.ttl / 3)", "await asyncio.sleep(self.ttl * 3)",
      f"{T_POLITE}::test_a_renewed_slot_outlives_the_ttl"),
    m("status_reason_generic", "dead-letter reasons (the page's status)", "worker/render.py",
      'raise PermanentStatus(f"HTTP {status} from {page.url}", reason=f"http_{status}")',
      'raise PermanentStatus(f"HTTP {status} from {page.url}", reason="http_error")',
      f"{T_DAEMON}::test_404_dead_letters_at_once_and_500_retries_then_dead_letters_with_history"),
    m("s3_outage_is_permanent", "dead-letter reasons (an outage is never a dead letter)", "archive/storage/s3.py",
      'except _FAILURES as exc:\n            raise StorageUnavailable(f"cannot read {key}',
      'except _FAILURES as exc:\n            raise StorageRefused(f"cannot read {key}',
      "tests/ingest/test_daemon.py::test_an_s3_outage_delays_results_and_loses_none"),
    m("extraction_failed_retryable", "dead-letter reasons (extraction dead at once)", "errors.py",
      "class ExtractionFailed(PermanentError):", "class ExtractionFailed(RetryableError):",
      "tests/e2e/test_extraction.py"),
    m("warc_payload_digest", "WARC validity", "worker/warc.py",
      "digest = payload_digest(body)", 'digest = payload_digest(body + b" ")',
      f"{T_WARC}::test_a_page_as_warc_passes_warcio_check_and_indexes"),
    m("artifact_no_leader_read", "nothing lost on a cluster (artifacts)", "artifacts/store.py",
      "chunk = await self._js.get_msg(ARTIFACTS_STREAM, seq, subject=_chunk_subject(nuid), next=True)",
      "raise nats.js.errors.NotFoundError",
      "tests/artifacts/test_store.py::test_a_replica_behind_the_leader_cannot_make_an_artifact_missing"),
    m("standing_direct_get", "nothing lost on a cluster (standing results)", "status/standing.py",
      "msg = await js.get_msg(names.RESULTS_STREAM, cursor, subject=subject, next=True)",
      "msg = await js.get_msg(names.RESULTS_STREAM, cursor, subject=subject, next=True, direct=True)",
      "tests/status/test_standing.py"),
    # -- the breaks of issue 33 that left the suite green ------------------------------------------
    m("warc_keeps_content_encoding", "WARC: decoded bodies claim no encoding", "worker/warc.py",
      '("X-Archive-Orig-Content-Encoding", value', '("Content-Encoding", value',
      f"{T_WARC}::test_compressed_responses_authorization_and_a_cut_connection_in_the_warc"),
    m("warc_authorization_clear", "WARC: credentials masked", "worker/warc.py",
      'MASKED if lower in masked else one.replace("\\r", "")', 'one.replace("\\r", "")',
      f"{T_WARC}::test_compressed_responses_authorization_and_a_cut_connection_in_the_warc"),
    m("warc_disconnect_unmarked", "WARC-Truncated: disconnect", "worker/warc.py",
      'self._record(response, "disconnect", f"body cut: {failure}")', 'self._record(response, None, "")',
      f"{T_WARC}::test_compressed_responses_authorization_and_a_cut_connection_in_the_warc"),
    m("reaper_no_dead_status", "reaper records `dead` in STATUS", "worker/reaper.py",
      "if letter.task_id and not await self.board.record(", "if False and not await self.board.record(",
      f"{T_DAEMON}::test_the_reaper_discards_what_the_killed_deliveries_stored"),
    m("robots_star_agent", "robots.txt read for the crawl's own agent", "crawl/robots.py",
      ".can_fetch(url, agent)", '.can_fetch(url, "*")',
      f"{T_FRONT}::test_robots_is_read_for_the_crawls_own_agent"),
    m("robots_cached_two_days", "robots.txt cached a day", "crawl/robots.py",
      "ROBOTS_TTL = 24 * 3600.0", "ROBOTS_TTL = 48 * 3600.0",
      f"{T_FRONT}::test_robots_is_cached_for_a_day_then_fetched_again"),
    m("robots_not_cached", "robots.txt cached a day", "crawl/robots.py",
      "ROBOTS_TTL = 24 * 3600.0", "ROBOTS_TTL = 0.0",
      f"{T_FRONT}::test_robots_is_cached_for_a_day_then_fetched_again"),
    m("fetch_one_read", "robots.txt and sitemaps read to their bound", "net/checked.py",
      "body = await read_up_to(response.content, max_bytes)", "body = await response.content.read(max_bytes)",
      f"{T_FRONT}::test_a_long_robots_txt_arriving_in_many_reads_is_read_to_its_end",
      "tests/crawl/test_sitemaps.py"),
    m("robots_delay_star_agent", "robots.txt read for the crawl's own agent", "crawl/robots.py",
      ".crawl_delay(agent)", '.crawl_delay("*")',
      f"{T_FRONT}::test_robots_is_read_for_the_crawls_own_agent"),
    # -- untested README promises --------------------------------------------------------------------
    Mutant("sessions_share_one_key", "sessions isolated from each other", (
        Edit("worker/sessions.py", "entry = await (await self._bucket()).get(name)",
             'entry = await (await self._bucket()).get("shared")'),
        Edit("worker/sessions.py", "await bucket.put(stored.name, value)",
             'await bucket.put("shared", value)')),
        (f"{T_SESS}::test_sessions_are_isolated_from_each_other_and_from_session_less_tasks",)),
    m("session_in_a_reused_tab", "sessions isolated from session-less tasks", "worker/browser/pool.py",
      "tab = None if session is not None else await self._idle_tab(", "tab = await self._idle_tab(",
      f"{T_SESS}::test_sessions_are_isolated_from_each_other_and_from_session_less_tasks"),
    m("unknown_session_reason", "unknown_session at the worker", "worker/sessions.py",
      'reason="unknown_session")', 'reason="invalid_task")',
      f"{T_SESS}::test_a_task_naming_a_session_no_rule_covers_is_dead_lettered_at_once"),
    m("unknown_extractor_unchecked", "unknown_extractor at the worker", "worker/daemon.py",
      "if task.options.extractor is not None and task.options.extractor not in self.extractors:", "if False:",
      "tests/worker/test_extraction.py"),
    m("record_unbounded", "record_too_large at the worker", "extract/records.py",
      "if size > max_bytes:", "if size > max_bytes * 1000:",
      "tests/worker/test_extraction.py"),
    m("no_cooling_on_503", "cooling on 503", "worker/daemon.py",
      'if exc.reason not in ("http_429", "http_503"):', 'if exc.reason not in ("http_429",):',
      f"{T_POLITE}::test_a_503_without_retry_after_cools_its_host_for_cool_default"),
    m("cool_default_ignored", "cool_default", "worker/daemon.py",
      "else self.settings.worker.cool_default", "else 0.0",
      f"{T_POLITE}::test_a_503_without_retry_after_cools_its_host_for_cool_default"),
    m("fleet_politeness_ignored", "fleet_politeness=false", "worker/daemon.py",
      "if not self.settings.worker.fleet_politeness:", "if False:",
      f"{T_POLITE}::test_without_fleet_politeness_a_worker_keeps_no_host_limit"),
    m("not_html_followed", "not_followed: not_html", "crawl/frontier.py",
      "if not links.followable:", "if False:",
      f"{T_FRONT}::test_a_non_html_pages_links_are_not_followed_and_a_cut_list_says_how_many"),
    m("links_cut_unrecorded", "links_cut", "crawl/frontier.py",
      'record["links_cut"] = links.total - len(links.links)', "pass",
      f"{T_FRONT}::test_a_non_html_pages_links_are_not_followed_and_a_cut_list_says_how_many"),
    m("detach_starts_nothing", "crawl --detach", "cli/crawl.py",
      "return await start_crawl(bus, s, spec)", "return {}",
      "tests/cli/test_crawl.py"),
    m("session_proxy_not_preferred", "sticky_session across workers", "worker/render.py",
      "session=task.options.session, prefer=prefer)", "session=task.options.session, prefer=None)",
      "tests/worker/test_proxies.py::test_a_session_keeps_its_proxy_on_another_worker"),
    Mutant("fts_query_interpolated", "search: the query is a parameter, never SQL", (
        Edit("search/sqlite.py", "WHERE pages_fts MATCH ?", "WHERE pages_fts MATCH '{{text}}' AND ? IS NOT NULL"),
        Edit("search/sqlite.py", "SEARCH.format(where=where)", "SEARCH.format(where=where, text=query.text)")),
        ("tests/search/test_search.py::test_query_text_is_a_parameter_never_sql",)),
)


# -- running ------------------------------------------------------------------------------------


class StalePattern(Exception):
    pass


def apply(mutant: Mutant) -> dict[Path, str]:
    """The files' original texts (to restore); every edit checked before any file is written."""
    originals: dict[Path, str] = {}
    texts: dict[Path, str] = {}
    for edit in mutant.edits:
        path = ROOT / SRC / edit.file
        text = texts.get(path) or path.read_text()
        originals.setdefault(path, text)
        found = text.count(edit.old)
        if found != 1:
            raise StalePattern(f"{mutant.name}: {edit.file} holds {found} copies of {edit.old!r} (need exactly 1)")
        texts[path] = text.replace(edit.old, edit.new)
    for path, text in texts.items():
        path.write_text(text)
    return originals


def restore(originals: dict[Path, str]) -> None:
    for path, text in originals.items():
        path.write_text(text)


def pytest(mutant: Mutant, extra: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           *extra, *mutant.tests]
    # Its own process group: on a timeout or Ctrl-C the servers and browsers the tests started go too.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=mutant.timeout)
    except BaseException:
        _stop_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def _stop_group(proc: subprocess.Popen[str]) -> None:
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_one(mutant: Mutant, extra: list[str], baseline: bool = False) -> tuple[str, float, str]:
    started = time.monotonic()
    if baseline:
        try:
            clean = pytest(mutant, extra)
        except subprocess.TimeoutExpired:
            return "baseline times out", time.monotonic() - started, f"over {mutant.timeout:.0f}s"
        if clean.returncode != 0:
            return "baseline fails", time.monotonic() - started, (clean.stdout + clean.stderr).strip()[-100:]
    originals = apply(mutant)
    try:
        proc = pytest(mutant, extra)
        outcome = {0: "survived", 1: "killed"}.get(proc.returncode, f"error (pytest exit {proc.returncode})")
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    except subprocess.TimeoutExpired:
        outcome, tail = "killed (timeout)", [f"over {mutant.timeout:.0f}s"]
    finally:
        restore(originals)
    return outcome, time.monotonic() - started, tail[0]


def check(chosen: list[Mutant]) -> int:
    stale = 0
    for mt in chosen:
        try:
            restore(apply(mt))
        except StalePattern as exc:
            print(f"STALE: {exc}", file=sys.stderr)
            stale += 1
    print(f"{len(chosen) - stale} of {len(chosen)} mutants apply")
    return 2 if stale else 0


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="run this mutant only")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--check", action="store_true", help="only check that every pattern is found once")
    parser.add_argument("--baseline", action="store_true",
                        help="first run each mutant's tests unbroken: a test that fails anyway proves nothing")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    args = parser.parse_args()
    known = {mt.name: mt for mt in MUTANTS}
    unknown = [n for n in args.only if n not in known]
    if unknown:
        parser.error(f"no mutant named {', '.join(unknown)}; --list shows them")
    chosen = [known[n] for n in args.only] if args.only else list(MUTANTS)
    if args.list:
        for mt in chosen:
            print(f"{mt.name:32} {mt.guarantee:48} {' '.join(mt.tests)}")
        return 0
    if args.check:
        return check(chosen)
    signal.signal(signal.SIGTERM, _interrupt)  # a stopped run restores the files like Ctrl-C does
    rows, stale = [], False
    try:
        for mt in chosen:
            try:
                outcome, seconds, tail = run_one(mt, args.pytest_args, args.baseline)
            except StalePattern as exc:
                print(f"STALE: {exc}", file=sys.stderr, flush=True)
                outcome, seconds, tail, stale = "stale pattern", 0.0, str(exc), True
            rows.append((mt, outcome, seconds))
            print(f"{mt.name:32} {outcome:18} {seconds:7.1f}s  {tail[:100]}", flush=True)
    except KeyboardInterrupt:  # the files are restored by run_one's finally
        print("interrupted: files restored", file=sys.stderr)
    print()
    print("| mutant | guarantee | test | result | seconds |")
    print("|---|---|---|---|---|")
    for mt, outcome, seconds in rows:
        tests = "<br>".join(f"`{t}`" for t in mt.tests)
        print(f"| `{mt.name}` | {mt.guarantee} | {tests} | {outcome} | {seconds:.0f} |")
    if stale:
        return 2
    return 0 if all(o.startswith("killed") for _, o, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Whether a task is already done, read from RESULTS' leader: a replica that has not caught up
(any replica answers a direct get) must not make a stored result look absent, or the next
delivery would render the page again and the reaper would file a letter for an archived task."""

from __future__ import annotations

from datetime import UTC, datetime

from busscrape.bus import names
from busscrape.model.messages import ScrapeResult, encode
from busscrape.status.standing import objects_of, standing_results
from tests.support.bus import lagging_replica


def result(task_id: str, task_seq: int, attempt: int = 1) -> ScrapeResult:
    url = "http://127.0.0.2/p"
    return ScrapeResult(task_id=task_id, task_seq=task_seq, url=url, original_url=url, final_url=url, status=200,
                        worker="w", attempt=attempt, scraped_at=datetime(2026, 1, 1, tzinfo=UTC))


async def test_a_replica_behind_the_leader_cannot_hide_a_standing_result(applied):
    js = applied.js
    mine, other = "a" * 32, "b" * 32
    await js.publish(names.result_subject(other), encode(result(other, 1)), stream=names.RESULTS_STREAM)
    await js.publish(names.result_subject(mine), encode(result(mine, 7, attempt=2)), stream=names.RESULTS_STREAM)
    await js.publish(names.result_subject(mine), encode(result(mine, 3)), stream=names.RESULTS_STREAM)  # older seq
    # The replica answering direct gets has the other task's result only.
    await lagging_replica(js, names.RESULTS_STREAM, keeps=names.result_subject(other))
    found = await standing_results(js, mine, 7)
    assert found is not None and [(r.task_seq, r.attempt) for r in found] == [(7, 2)]
    assert objects_of(found) == set()
    assert await standing_results(js, "c" * 32, 1) == []  # none stored: the leader says so

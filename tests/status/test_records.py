"""STATUS records against a real nats-server: the latest record of a task never steps back from
its outcome, whichever service records last."""

from __future__ import annotations

from datetime import timedelta

from busscrape.model.messages import utcnow
from busscrape.status.records import StatusBoard, TaskStatus, Transitions

DISPATCHED = utcnow()


def delivery(board: StatusBoard, attempt: int, dispatched=DISPATCHED) -> Transitions:
    return Transitions(board, task_id="t1", url="http://127.0.0.2/", dispatched_at=dispatched,
                       attempt=attempt, worker="w1")


async def archive(board: StatusBoard, dispatched=DISPATCHED) -> None:
    """What the ingester records."""
    assert await board.record(TaskStatus(task_id="t1", state="archived", dispatched_at=dispatched, attempt=1))


async def states(board: StatusBoard) -> list[str]:
    return [s.state for s in await board.history("t1")]


async def test_a_step_after_the_ingesters_outcome_is_left_out(applied):
    board = StatusBoard(applied.js)
    story = delivery(board, attempt=1)
    await story.start()
    await archive(board)  # the ingester was quicker than the worker's `rendered`
    await story.step("rendered", status=200)
    (latest, _) = await board.latest("t1")
    assert latest.state == "archived"
    assert await states(board) == ["running", "archived"]


async def test_a_delivery_records_its_steps_in_order(applied):
    board = StatusBoard(applied.js)
    story = delivery(board, attempt=1)
    await story.start()
    await story.step("retrying", reason="http_503")
    assert await story.outcome("dead", reason="http_503")
    assert await states(board) == ["running", "retrying", "dead"]
    (latest, _) = await board.latest("t1")
    assert latest.attempt == 1 and latest.worker == "w1" and latest.dispatched_at == DISPATCHED


async def test_a_redelivery_of_an_archived_task_records_nothing(applied):
    board = StatusBoard(applied.js)
    first = delivery(board, attempt=1)
    await first.start()
    await archive(board)  # attempt 1 published; its worker died before the ack
    again = delivery(board, attempt=2)
    await again.start()
    await again.step("rendered", status=200)
    assert again.settled and await again.outcome("dead", reason="http_500")
    assert await states(board) == ["running", "archived"]


async def test_a_later_delivery_takes_over_from_an_earlier_one_still_running(applied):
    board = StatusBoard(applied.js)
    slow = delivery(board, attempt=1)
    await slow.start()
    later = delivery(board, attempt=2)  # ack-wait ran out while attempt 1 rendered
    await later.start()
    await slow.step("rendered", status=200)  # attempt 1 finishes late: its step is out of date
    await later.step("rendered", status=200)
    history = await board.history("t1")
    assert [(s.state, s.attempt) for s in history] == [("running", 1), ("running", 2), ("rendered", 2)]


async def test_an_outcome_of_an_earlier_dispatch_does_not_stop_a_new_one(applied):
    board = StatusBoard(applied.js)
    await archive(board, dispatched=DISPATCHED - timedelta(days=7))  # last week's crawl
    story = delivery(board, attempt=2)
    await story.start()
    await story.step("rendered", status=200)
    assert not story.settled
    assert await states(board) == ["archived", "running", "rendered"]


async def test_an_attempt_deferred_after_it_started_is_running_once(applied):
    """A delivery deferred by the fleet gate after it recorded ``running`` comes back as the same
    attempt: its next delivery goes on from that record instead of recording ``running`` again."""
    board = StatusBoard(applied.js)
    first = delivery(board, attempt=1)
    await first.start()  # then deferred: its host's start was taken by another worker
    resumed = Transitions(board, task_id="t1", url="http://127.0.0.2/", dispatched_at=DISPATCHED,
                          attempt=1, worker="w1", resumed=True)
    await resumed.start()
    await resumed.step("rendered", status=200)
    assert await states(board) == ["running", "rendered"]
    retried = Transitions(board, task_id="t1", url="http://127.0.0.2/", dispatched_at=DISPATCHED,
                          attempt=2, worker="w1", resumed=True)
    await retried.start()  # another attempt: its own `running`
    assert await states(board) == ["running", "rendered", "running"]

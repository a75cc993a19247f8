"""Queueing tasks from a request (``POST /tasks``) exactly as ``busscrape dispatch`` queues lines.

Each requested task becomes one JSONL line (``{"url": …}`` or a full task spec) and the lines
go through a real ``Dispatcher``: the same parser, URL normalisation, task ids, de-duplication
(in the request, then across runs by the atomic create in SEEN), ``Nats-Msg-Id`` and PubAck
accounting as a dispatch of a file. What this module adds is the answer per task: the
dispatcher reports rejections by line and publications by task id, so the task id of every
line is computed beforehand the way the dispatcher computes it (``identity``) and the outcomes
are matched back to the request's order.

Outcomes: ``queued`` (new, in TASKS now), ``already_seen`` (queued before, within the recrawl
window), ``duplicate`` (the same task earlier in this request), ``rejected`` (with the
dispatcher's reason and detail), ``failed`` (NATS did not confirm it: safe to send again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict

from busscrape.bus.connection import Bus
from busscrape.dispatch.dispatcher import Dispatcher, DispatchSummary
from busscrape.dispatch.identity import TaskIdentity
from busscrape.dispatch.inputs import Rejection, TaskDefaults
from busscrape.errors import InputError
from busscrape.settings import Settings

Outcome = Literal["queued", "already_seen", "duplicate", "rejected", "failed"]


class TaskOutcome(BaseModel):
    """What became of one requested task."""

    model_config = ConfigDict(frozen=True)

    index: int
    """Position in the request (0-based)."""
    url: str
    """The URL as given."""
    outcome: Outcome
    task_id: str | None = None
    """Set unless rejected: look it up with ``GET /tasks/{task_id}``."""
    reason: str | None = None
    """Why it was rejected (the dispatcher's codes: ``unsupported_scheme``, ``invalid_host`` …)."""
    detail: str | None = None


@dataclass
class Intake:
    """Every outcome in request order, and the dispatcher's summary."""

    outcomes: list[TaskOutcome]
    summary: DispatchSummary
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for outcome in ("queued", "already_seen", "duplicate", "rejected", "failed"):
            self.counts[outcome] = sum(o.outcome == outcome for o in self.outcomes)


async def submit(bus: Bus, settings: Settings, items: list[dict[str, Any]], *, labels: dict[str, str] | None = None,
                 force: bool = False) -> Intake:
    """Dispatch ``items`` (JSONL task specs: ``{"url": …, "steps": …, …}``) and say what became of each.

    Raises ``ConfigurationError`` (streams missing …) before anything is published.
    """
    defaults = TaskDefaults(labels=dict(labels or {}))
    lines = [orjson.dumps(item).decode() for item in items]
    ids = _task_ids(lines, settings, defaults)
    published: set[str] = set()
    seen: set[str] = set()
    rejected: dict[int, Rejection] = {}
    async with Dispatcher(bus, settings, defaults, force=force, on_published=published.add,
                          on_already_seen=seen.add,
                          on_rejected=lambda r: rejected.__setitem__(r.line, r)) as dispatcher:
        summary = await dispatcher.dispatch(lines, "jsonl")
    outcomes: list[TaskOutcome] = []
    claimed: set[str] = set()
    for index, item in enumerate(items):
        url = str(item.get("url", ""))
        rejection = rejected.get(index + 1)
        task_id = ids[index]
        if rejection is not None or task_id is None:
            reason, detail = (rejection.reason, rejection.detail) if rejection else ("invalid_task", "not a task")
            outcomes.append(TaskOutcome(index=index, url=url, outcome="rejected", reason=reason, detail=detail))
            continue
        if task_id in claimed:
            outcome: Outcome = "duplicate"
        else:
            claimed.add(task_id)
            outcome = "queued" if task_id in published else "already_seen" if task_id in seen else "failed"
        outcomes.append(TaskOutcome(index=index, url=url, outcome=outcome, task_id=task_id))
    return Intake(outcomes, summary)


def _task_ids(lines: list[str], settings: Settings, defaults: TaskDefaults) -> list[str | None]:
    """The task id the dispatcher will give each line (None where it will reject it)."""
    identity = TaskIdentity(settings, defaults)
    ids: list[str | None] = []
    for number, line in enumerate(lines, 1):
        try:
            ids.append(identity.of_line(number, line))
        except InputError:
            ids.append(None)
    return ids

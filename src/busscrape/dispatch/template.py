"""Task ids and payloads for the common case of a dispatch: many URLs, one set of task options."""

from __future__ import annotations

import orjson

from busscrape.dispatch.inputs import TaskDefaults, TaskSpec
from busscrape.model.messages import ScrapeTask, encode, identity_tail, task_key, utcnow


class TaskTemplate:
    """Task ids and payloads for URLs sharing steps, options and labels, without per-URL models.

    Byte for byte what ``messages.task_key`` and ``messages.encode(ScrapeTask(...))`` produce
    (the tests hold it to that), at a fraction of the cost: the shared parts are serialised once
    and spliced in as ``orjson.Fragment``s, in the model's own field order.
    """

    def __init__(self, defaults: TaskDefaults) -> None:
        self.defaults = defaults
        sample = ScrapeTask(task_id="0" * 32, url="http://x/", original_url="http://x/", steps=defaults.steps,
                            options=defaults.options, labels=defaults.labels)
        self._base: dict[str, object] = {k: orjson.Fragment(orjson.dumps(v))
                                          for k, v in orjson.loads(encode(sample)).items()}
        self._key_tail = identity_tail(sample.steps, sample.options)

    def fits(self, spec: TaskSpec) -> bool:
        """Whether ``spec`` carries exactly the defaults this template was built from."""
        d = self.defaults
        return spec.steps is d.steps and spec.options is d.options and spec.labels is d.labels

    def key(self, url: str) -> str:
        return task_key(url, tail=self._key_tail)

    def payload(self, task_id: str, url: str, original_url: str) -> bytes:
        doc = self._base.copy()
        doc["task_id"], doc["url"], doc["original_url"], doc["dispatched_at"] = task_id, url, original_url, utcnow()
        return orjson.dumps(doc)

"""``patiently``: a request a daemon cannot do without rides out a moment without a leader."""

import nats.errors
import nats.js.errors
import pytest

from busscrape.bus.retry import passing, patiently


def test_what_goes_away_by_itself_and_what_is_an_answer():
    assert passing(nats.errors.TimeoutError()) and passing(nats.js.errors.ServiceUnavailableError())
    assert passing(ConnectionRefusedError())
    assert not passing(nats.js.errors.NotFoundError()) and not passing(nats.js.errors.BadRequestError())
    assert not passing(nats.errors.NoRespondersError()) and not passing(ValueError())


async def test_passing_failures_are_retried_and_answers_are_not():
    calls = []

    async def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise nats.js.errors.ServiceUnavailableError()
        return "leader"

    assert await patiently(flaky, within=10) == "leader" and len(calls) == 3

    async def missing():
        calls.append(1)
        raise nats.js.errors.NotFoundError()

    calls.clear()
    with pytest.raises(nats.js.errors.NotFoundError):
        await patiently(missing, within=10)
    assert len(calls) == 1


async def test_it_gives_up_after_its_time():
    async def never():
        raise nats.errors.TimeoutError()

    with pytest.raises(nats.errors.TimeoutError):
        await patiently(never, within=0.3)

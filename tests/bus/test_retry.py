"""The one backoff curve every retry uses: doubling, jittered, capped, and at least what was asked."""

from busscrape.bus.retry import backoff


def test_delays_double_with_jitter_up_to_the_cap():
    for attempt, low, high in [(1, 0.5, 1), (2, 1, 2), (4, 4, 8), (7, 30, 60), (10_000, 30, 60)]:
        delays = [backoff(attempt, 1.0, 60.0) for _ in range(50)]
        assert all(low <= d <= high for d in delays), (attempt, min(delays), max(delays))
        assert len(set(delays)) > 1  # jittered: retries that failed together spread out


def test_a_retry_after_is_honoured_but_never_beyond_the_cap():
    assert all(backoff(1, 2.0, 300.0, at_least=120.0) >= 120.0 for _ in range(20))
    assert all(backoff(1, 2.0, 300.0, at_least=10_000.0) == 300.0 for _ in range(20))
    assert all(1.0 <= backoff(1, 2.0, 300.0, at_least=0.5) <= 2.0 for _ in range(20))

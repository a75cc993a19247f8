"""What a failed navigation stands for: Chromium's error texts, as a Playwright error carries them."""

import pytest
from playwright.async_api import Error as PlaywrightError

from busscrape.errors import PageNetworkError, PermanentError, StorageUnavailable
from busscrape.worker.page_errors import cut_off_by_network_change, navigation_error

URL = "http://127.0.0.2:8080/p"


def failed(code: str) -> PlaywrightError:
    return PlaywrightError(f"Page.goto: net::{code} at {URL}\nCall log:\n  - navigating to \"{URL}\"")


def test_a_network_change_on_the_workers_machine_is_an_outage_not_the_pages_attempt():
    # Seen in a parallel run of the suite (most likely a container test starting on the same host):
    # Chromium dropped a loopback navigation in flight, and the delivery spent an attempt as a
    # page network error.
    error = navigation_error(URL, failed("ERR_NETWORK_CHANGED"), None)
    assert isinstance(error, StorageUnavailable) and error.what == "network"
    assert str(error) == (f"navigation to {URL} cut off: this machine's network changed "
                          f"(Page.goto: net::ERR_NETWORK_CHANGED at {URL})")


@pytest.mark.parametrize(("code", "kind", "reason"), [
    ("ERR_CONNECTION_REFUSED", PageNetworkError, "network_error"),
    ("ERR_NAME_NOT_RESOLVED", PageNetworkError, "dns_error"),
    ("ERR_TOO_MANY_REDIRECTS", PermanentError, "redirect_loop"),
])
def test_the_pages_own_network_failures_stay_the_pages(code, kind, reason):
    error = navigation_error(URL, failed(code), None)
    assert type(error) is kind and error.reason == reason and not isinstance(error, StorageUnavailable)


def test_a_page_request_cut_off_by_a_network_change_makes_the_render_an_outage():
    # A stylesheet dropped by the network change would be missing from the capture through no
    # fault of the page's: the render is an outage (no attempt, rendered again), not archived.
    failed = [(f"{URL}/gone.png", "net::ERR_CONNECTION_REFUSED"), (f"{URL}/a.css", "net::ERR_NETWORK_CHANGED")]
    cut = cut_off_by_network_change(URL, failed)
    assert isinstance(cut, StorageUnavailable) and cut.what == "network" and f"{URL}/a.css" in str(cut)
    # The page's own failed requests are part of the page: captured as they are.
    assert cut_off_by_network_change(URL, failed[:1]) is None

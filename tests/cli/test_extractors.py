"""``busscrape extractors test NAME URL`` fetches as a worker would be let: under the network
policy, bounded by ``max_page_bytes``, with a clear error and exit 2 otherwise (the real CLI,
against a site on loopback)."""

import pytest
from aiohttp import web

from tests.support.cli import busscrape, clean_env
from tests.support.site import Site

pytestmark = pytest.mark.slow

PRODUCT = '<title>Kettle</title><h1 class="product-name">Kettle</h1><p class="price">12.50</p>'


@pytest.fixture
def shop():
    with Site(hosts=("127.0.0.2",)) as site:
        site.page("/kettle", PRODUCT)
        site.page("/hop", "", status=302, headers={"Location": "http://127.0.0.1:9/"})

        @site.route("/huge")
        async def huge(request: web.Request) -> web.StreamResponse:
            answer = web.StreamResponse(headers={"Content-Type": "text/html"})
            await answer.prepare(request)
            for _ in range(64):  # 4 MiB in 64 KiB writes, with no Content-Length
                await answer.write(b"<p>" + b"x" * 65_530 + b"</p>")
            return answer

        yield site


def test_a_url_the_policy_refuses_is_not_fetched(shop):
    done = busscrape("extractors", "test", "demo-product", shop.url("/kettle"), timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "refused by the network policy" in done.stderr and "--allow" in done.stderr, done.stderr
    assert shop.hits[("127.0.0.2", "/kettle")] == 0  # before: fetched with urllib, no policy


def test_a_redirect_to_a_refused_address_is_not_followed(shop):
    done = busscrape("extractors", "test", "demo-product", shop.url("/hop"), "--allow", "127.0.0.2/32")
    assert done.returncode == 2 and "refused by the network policy" in done.stderr, done.stderr


def test_a_page_over_max_page_bytes_is_refused_by_name(shop):
    env = clean_env(BUSSCRAPE_WORKER__MAX_PAGE_BYTES="256KiB")
    done = busscrape("extractors", "test", "demo-product", shop.url("/huge"), "--allow", "127.0.0.2/32", env=env)
    assert done.returncode == 2, (done.stdout[:300], done.stderr)
    assert "over max_page_bytes (262144 bytes" in done.stderr, done.stderr


def test_an_allowed_page_is_extracted(shop):
    done = busscrape("extractors", "test", "demo-product", shop.url("/kettle"), "--allow", "127.0.0.2/32")
    assert done.returncode == 0, done.stderr
    assert '"name": "Kettle"' in done.stdout and f'"url": "{shop.url("/kettle")}"' in done.stdout

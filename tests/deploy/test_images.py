"""The images, built here from a local base and run with podman (tests/support/containers.py).

Each service image starts busscrape as its numeric non-root user; the worker's drives its
Chromium; the all-in-one image ``busscrape`` crawls and runs a URL list into the folder mounted
at /data, as the README shows (``docker run --rm -v $PWD/out:/data busscrape crawl …``), with the
container on the host's network so it reaches the test's site on 127.0.0.2/127.0.0.3.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.containers import BUILD_ORDER, IMAGES, Images, podman
from tests.support.site import Site

pytestmark = [pytest.mark.slow, pytest.mark.containers, pytest.mark.timeout(1800)]

UID = 10001  # the images' user (USER 10001:10001)

# Launches the image's Chromium the way the worker does (busscrape's own binary lookup and
# switches) and renders a page.
RENDER = """
import asyncio
from playwright.async_api import async_playwright
from busscrape.settings import Settings
from busscrape.worker.browser.chromium import launch_args, launch_env, require_chromium

async def main():
    settings = Settings().browser
    binary = require_chromium(settings)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=binary.path, args=launch_args(settings), env=launch_env())
        page = await browser.new_page()
        await page.set_content("<title>t</title><p id=x></p><script>x.textContent = 6 * 7</script>")
        print(binary.path, await page.text_content("#x"), browser.version)
        await browser.close()

asyncio.run(main())
"""


@pytest.fixture(scope="module", autouse=True)
def built(images: Images) -> None:
    """Every image, in the order that shares the most layers (minutes on a fresh podman store)."""
    images.build(*BUILD_ORDER)


def metas(archive: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in archive.glob("dt=*/host=*/*/meta.json")]


def data_folder(tmp_path: Path, name: str, uid: int = UID) -> Path:
    """A folder for /data, owned by the container's user (as `chown 10001 out` in the docs)."""
    folder = tmp_path / name
    folder.mkdir()
    if os.geteuid() == 0:
        os.chown(folder, uid, uid)
    else:
        folder.chmod(0o777)
    return folder


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_each_image_runs_busscrape_as_its_non_root_user(images: Images, name: str) -> None:
    config = json.loads(podman("image", "inspect", images.tag(name)).stdout)[0]["Config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"][-1] == "busscrape"
    result = podman("run", "--rm", images.tag(name), "--help", timeout=120)
    assert "Usage: busscrape" in result.stdout
    whoami = podman("run", "--rm", "--entrypoint", "id", images.tag(name), "-u", timeout=120)
    assert whoami.stdout.strip() == str(UID)


@pytest.mark.parametrize("name", ["worker", "busscrape"])
def test_the_browser_images_launch_their_chromium(images: Images, name: str) -> None:
    result = podman("run", "--rm", "--entrypoint", "python", images.tag(name), "-c", RENDER, timeout=180)
    path, rendered, version = result.stdout.split()
    assert path == "/usr/lib/chromium/chromium-headless-shell"
    assert rendered == "42"
    assert int(version.split(".")[0]) >= 100


def test_all_in_one_image_crawls_into_data(images: Images, site: Site, tmp_path: Path) -> None:
    count = 60  # more than --max-pages: the budget holds
    for n in range(1, count):
        site.page(f"/p/{n}", f"<title>p{n}</title><a href='/'>home</a> <a href='/p/{n % (count - 1) + 1}'>next</a>")
    site.page("/", "<title>index</title>" + "".join(f"<a href='/p/{n}'>{n}</a> " for n in range(1, count)))
    out = data_folder(tmp_path, "out")

    result = podman("run", "--rm", "--network", "host", "-v", f"{out}:/data", images.tag("busscrape"),
                    "crawl", site.url("/"), "--max-pages", "50", "--allow", site.origin(),
                    "-o", "pages.jsonl", "--json", timeout=600)

    archived = metas(out / "archive")
    urls = {m["url"] for m in archived}
    assert len(archived) == len(urls) == 50, result.stdout[-2000:]
    assert site.url("/") in urls and urls <= {site.url("/")} | {site.url(f"/p/{n}") for n in range(1, count)}
    rows = [json.loads(line) for line in (out / "pages.jsonl").read_text().splitlines()]
    assert {r["url"] for r in rows} == urls
    # Written by the image's user into the state dir /data: the nats-server store and the archive.
    assert (out / "archive").stat().st_uid == (UID if os.geteuid() == 0 else os.geteuid())
    assert (out / "nats").is_dir()


def test_all_in_one_image_runs_a_url_file_from_data(images: Images, site: Site, tmp_path: Path) -> None:
    urls = [site.page(f"/run/{n}", f"<title>run {n}</title>", ) for n in range(12)]
    urls = [u.replace(site.hosts[0], site.hosts[1]) for u in urls]  # the other origin
    # As the docs run it: as some user of the host (`--user "$(id -u):$(id -g)"`), with no home folder.
    user = 4242 if os.geteuid() == 0 else os.geteuid()
    out = data_folder(tmp_path, "out", uid=user)
    (out / "urls.txt").write_text("\n".join(urls) + "\n")

    result = podman("run", "--rm", "--network", "host", "--user", f"{user}:{user}", "-v", f"{out}:/data",
                    images.tag("busscrape"), "run", "/data/urls.txt", "--allow", site.origin(1), "--json",
                    timeout=600)

    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(m["url"] for m in metas(out / "archive")) == sorted(urls), summary
    assert not list((out / "archive").glob("deadletter/**/*.json"))
    assert (out / "archive").stat().st_uid == user


def test_all_in_one_image_runs_the_demo_without_a_command(images: Images, tmp_path: Path) -> None:
    out = data_folder(tmp_path, "out")

    podman("run", "--rm", "-v", f"{out}:/data", images.tag("busscrape"), timeout=600)

    rows = [json.loads(line) for line in (out / "demo-pages.jsonl").read_text().splitlines()]
    archived = {m["url"] for m in metas(out / "archive")}
    assert len(rows) >= 10
    assert {r["url"] for r in rows if not r["dead_reason"]} == archived


def test_all_in_one_image_says_how_to_fix_a_data_folder_it_cannot_write(images: Images, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()  # owned by whoever runs the test, not by the image's user (as Docker makes a missing one)
    out.chmod(0o755)
    if os.geteuid() != 0:
        pytest.skip("needs a folder the container's uid 10001 cannot write: run as root")

    result = podman("run", "--rm", "-v", f"{out}:/data", images.tag("busscrape"), "crawl", "http://127.0.0.2:9/",
                    timeout=300, check=False)

    assert result.returncode == 2, result.stderr[-2000:]
    assert "not writable by uid 10001" in result.stderr and "--user" in result.stderr
    assert "Traceback" not in result.stderr

"""The console's overview lists each worker with the host slots it holds (its HOSTS leases), as
``busscrape status`` does, and says when none is held."""

from __future__ import annotations

import html
import re

import aiohttp

from busscrape.api.server import ApiServer
from busscrape.worker.fleet_gate import FleetGate, Slot
from busscrape.worker.host_rules import HostRules, Limit
from tests.api.test_server import AUTH, api_settings  # noqa: F401  (fixture)

ROW = re.compile(r"<tr><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td></tr>")


async def overview(http: aiohttp.ClientSession) -> str:
    async with http.get("/") as response:
        assert response.status == 200
        return await response.text()


async def test_the_overview_lists_each_workers_host_slots(applied, api_settings):  # noqa: F811
    gate = FleetGate(applied.js, HostRules(Limit(3, 0)), holder="<b>w1</b>", busy_retry=1)
    async with ApiServer(applied, api_settings) as api, aiohttp.ClientSession(base_url=api.url, headers=AUTH) as http:
        assert 'id="worker-slots-none"' in await overview(http)
        held = [await gate.enter("a.example"), await gate.enter("a.example"), await gate.enter("b.example")]
        assert all(isinstance(slot, Slot) for slot in held)
        page = await overview(http)
        table = page.split('<table id="worker-slots">', 1)[1].split("</table>", 1)[0]
        assert [tuple(map(html.unescape, row)) for row in ROW.findall(table)] == [
            ("<b>w1</b>", "3", "a.example ×2, b.example ×1")]  # the name shown as text
        for slot in held:
            await slot.release()  # type: ignore[union-attr]
        assert 'id="worker-slots-none"' in await overview(http)

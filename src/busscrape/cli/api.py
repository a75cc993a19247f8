"""``busscrape api``: the HTTP API (``busscrape.api``) until SIGTERM/SIGINT."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from busscrape.cli.app import app, run, serve, settings

if TYPE_CHECKING:
    from busscrape.settings import Settings


HELP = """Serve the HTTP API and the web console: POST /tasks (queue URLs as dispatch does),
GET /tasks/{id} and GET /tasks?url= (a task's history), GET /search?q= (the archive's full-text
index), POST /crawls and GET /crawls/{id}, GET /healthz, the OpenAPI document at /openapi.json,
and the console at / (overview, crawls, pages, dead letters) for a browser.

With BUSSCRAPE_API__TOKEN set, every request but /healthz and /openapi.json needs
`Authorization: Bearer <token>` (the console's login form takes it once for a session cookie);
without it the console answers only on loopback. Without BUSSCRAPE_NATS__URL, on the state dir of a
finished `busscrape run` it reopens that run's store (as status and dlq do). Bodies over
BUSSCRAPE_API__MAX_BODY_BYTES are refused (413). SIGTERM/SIGINT stop listening and give requests
in flight 5 s. Exit codes: 0 stopped; 2 cannot
connect, streams missing, or the address is taken.
"""


@app.command("api", help=HELP)
def api_cmd(
    host: str | None = typer.Option(None, "--host", help="Address to listen on (default: BUSSCRAPE_API__HOST, "
                                    "127.0.0.1)."),
    port: int | None = typer.Option(None, "--port", min=0, max=65535, help="Port (default: BUSSCRAPE_API__PORT, "
                                    "8080; 0 picks a free one)."),
    nats_url: str | None = typer.Option(None, "--nats-url", help="NATS server URL (default: BUSSCRAPE_NATS__URL)."),
) -> None:
    s = settings(nats={"url": nats_url}, api={"host": host, "port": port}, state_nats=True)
    raise typer.Exit(run(_serve(s)))


async def _serve(s: Settings) -> int:
    from busscrape.api.server import ApiServer
    from busscrape.bus.connection import Bus

    async with await Bus.connect(s, name="busscrape-api") as bus:
        code: int = await serve(ApiServer(bus, s))
        return code

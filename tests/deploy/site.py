"""The site the compose test crawls, served on the stack's bus network (compose.podman.yaml).

Any path is a page titled by its path, answered after ``SITE_DELAY`` seconds, so that a test
can kill a worker or take the stack down while pages are in flight. Standard library only: it
runs in the local base image.
"""

from __future__ import annotations

import html
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DELAY = float(os.environ.get("SITE_DELAY", "0"))


class Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path in ("/robots.txt", "/favicon.ico"):
            self.send_error(404)
            return
        # On arrival, before the delay: the test reads which worker (address) has which page in flight.
        print(f"start {self.client_address[0]} {self.path}", flush=True)
        time.sleep(DELAY)
        title = html.escape(self.path)
        body = f"<!doctype html><html><head><title>{title}</title></head><body><p>{title}</p></body></html>"
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", 8080), Page).serve_forever()

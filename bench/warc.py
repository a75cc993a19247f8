"""Benchmark: the cost of the ``warc`` artifact, end to end, and its size next to a HAR with bodies.

In one run, on the same pages of bench/site.py and the same concurrency, ``busscrape run`` (one
worker process, archive to a local folder) alternates between the default artifacts (html,
screenshot, har, text) and the same plus ``warc``, each round on fresh URLs; pages/s is timed from
the first dispatch to the last archive, as in bench/e2e.py. The goal is warc-on / warc-off ≥ 0.85.
Then one more run with ``warc`` and ``--har-content embed`` compares, per page, the stored
``page.warc.gz`` with the HAR that embeds the same bodies (stored gzipped, and its raw size).

    .venv/bin/python bench/warc.py --pages 200 --concurrency 4 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchsite import BenchSite
from bench.e2e import busscrape_run

DEFAULT = "html,screenshot,har,text"


def sizes(archive: Path) -> dict[str, list[int]]:
    """Stored bytes per page of the WARC, of the HAR (gzipped and raw) and of the screenshot, from
    each meta.json."""
    out: dict[str, list[int]] = {"warc": [], "har.gz": [], "har": [], "screenshot": []}
    for meta in archive.glob("dt=*/host=*/*/meta.json"):
        objects = {o["name"]: o for o in json.loads(meta.read_text())["objects"]}
        if "page.warc.gz" in objects and "page.har.gz" in objects:
            out["warc"].append(objects["page.warc.gz"]["size"])
            out["har.gz"].append(objects["page.har.gz"]["size"])
            out["har"].append(objects["page.har.gz"]["original_size"])
            # The WARC holds the screenshot too (a resource record), the HAR does not.
            out["screenshot"].append(objects.get("screenshot.png", {}).get("size", 0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with BenchSite(pages=997) as site, tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        urls = site.urls(args.pages)
        ratios = []
        for r in range(args.rounds):
            rates = {}
            for mode, artifacts in (("off", DEFAULT), ("on", DEFAULT + ",warc")):
                urls_file = tmpdir / f"urls-{r}-{mode}.txt"
                urls_file.write_text("".join(f"{u}&round={r}&warc={mode}\n" for u in urls))
                rates[mode] = busscrape_run(urls_file, tmpdir / f"run-{r}-{mode}", args.concurrency,
                                            "--artifacts", artifacts)
            ratios.append(rates["on"] / rates["off"])
            print(f"round {r + 1}: warc off {rates['off']:.2f} pages/s  warc on {rates['on']:.2f} pages/s  "
                  f"on/off={ratios[-1]:.2f}", flush=True)
        print(f"warc on/off, median of {args.rounds} rounds: {statistics.median(ratios):.2f} (goal >= 0.85)")

        urls_file = tmpdir / "urls-sizes.txt"
        urls_file.write_text("".join(f"{u}&sizes=1\n" for u in urls))
        busscrape_run(urls_file, tmpdir / "run-sizes", args.concurrency,
                      "--artifacts", DEFAULT + ",warc", "--har-content", "embed")
        found = sizes(tmpdir / "run-sizes" / "state" / "archive")
        if not found["warc"]:
            raise SystemExit("no page archived both a WARC and a HAR")
        warc, har_gz, har, shot = (statistics.mean(found[k]) for k in ("warc", "har.gz", "har", "screenshot"))
        print(f"per page ({len(found['warc'])} pages): page.warc.gz {warc / 1024:.1f} KiB, of which the screenshot "
              f"{shot / 1024:.1f} KiB · HAR with embedded bodies {har_gz / 1024:.1f} KiB gzipped "
              f"({har / 1024:.1f} KiB raw) · WARC/HAR.gz {warc / har_gz:.2f}, without the screenshot "
              f"{(warc - shot) / har_gz:.2f}")


if __name__ == "__main__":
    main()

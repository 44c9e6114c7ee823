"""The store page of large stores in a real browser (issue 42, item 4).

For stores of 10^5 to 10^7 episodes (`write_scaled_store`: synthetic rows over a small real store's shards),
`mmdata view --serve`'s work before it serves (`view_server` and `write_site`: the manifest's columns read into
the episode table, 40 bytes an episode with two cameras), then in Debian's Chromium through Playwright: the
store page from navigation to its first 500 rows shown, the next page, a sort by duration and a filter by key,
each a request to the server's `rows.json`. Rounds alternate over the sizes; medians are reported.

usage: PYTHONPATH=.:benchmarks python benchmarks/viewer_bench.py [--episodes 100000 1000000 10000000]
       [--rounds 3] [--record viewer_scale_cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import machine_name, write_results  # noqa: E402
from scale_bench import small_real_store  # noqa: E402

import mmdata  # noqa: E402
from mmdata.store.scaled_store import write_scaled_store  # noqa: E402
from mmdata.viewer.episode_table import EpisodeTable  # noqa: E402
from mmdata.viewer.pages import write_site  # noqa: E402
from mmdata.viewer.server import view_server  # noqa: E402

CHROMIUM = os.environ.get("MMDATA_CHROMIUM", "/usr/bin/chromium")


def one_round(store: Path, out: Path, browser) -> dict:
    """Serve `store` from `out` and time its store page in `browser`."""
    started = time.perf_counter()
    opened = mmdata.open_store(str(store))
    table = EpisodeTable(opened)  # (read once for the server and the page, as `mmdata view --serve` does)
    server = view_server(opened, out, 0, table)
    write_site(opened, out, link_all=True, table=table)
    ready = time.perf_counter()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    page = browser.new_page()

    def until_loaded(number: int) -> None:
        expression = f"document.getElementById('episodes').dataset.loaded === '{number}'"
        while not page.evaluate(expression):
            time.sleep(0.005)

    figures = {"serve_ready_s": ready - started}
    for name, action, number in (
        ("page_load_s", lambda: page.goto(f"{origin}/index.html"), 1),
        ("next_page_s", lambda: page.locator("#next").click(), 2),
        ("sort_by_duration_s", lambda: page.locator("th[data-column=duration]").click(), 3),
    ):
        begun = time.perf_counter()
        action()
        until_loaded(number)
        figures[name] = time.perf_counter() - begun
    begun = time.perf_counter()
    page.locator("#filter").fill("episode_000042")
    while page.locator("#shown").text_content().split(" ")[0] != "1-1":
        time.sleep(0.005)
    figures["filter_by_key_s"] = time.perf_counter() - begun
    page.close()
    server.shutdown()
    server.server_close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, nargs="+", default=[10**5, 10**6, 10**7])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--record", default=None, help="write benchmarks/results/<NAME>.json")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    rows: dict[int, list[dict]] = {n: [] for n in args.episodes}
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as playwright:
        root = Path(folder)
        real = small_real_store(root)
        stores = {n: write_scaled_store(real, root / f"scaled-{n}.wds", n) for n in args.episodes}
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        for number in range(args.rounds):
            for episodes, store in stores.items():
                figures = one_round(store, root / f"view-{episodes}-{number}", browser)
                rows[episodes].append(figures)
                print(episodes, {k: round(v, 3) for k, v in figures.items()}, flush=True)
        browser.close()
    report = {
        "machine": machine_name(),
        "rounds": args.rounds,
        "sizes": [
            {"episodes": n, **{k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}}
            for n, runs in rows.items()
        ],
    }
    for size in report["sizes"]:
        print(size)
    if args.record:
        write_results(args.record, report)


if __name__ == "__main__":
    main()

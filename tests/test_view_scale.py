"""The store page of a large store: the table sorted, filtered and paged over every episode from the manifest's
columns (`EpisodeTable`), answered a page at a time by `mmdata view --serve` (`rows.json`) and driven in a real
browser; a written page holds the first rows and says how to see them all."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

import mmdata
from mmdata.errors import OptionError
from mmdata.store import manifest_reader
from mmdata.store.scaled_store import write_scaled_store
from mmdata.viewer.episode_table import EpisodeTable, TableQuery
from mmdata.viewer.pages import INLINE_ROWS, write_site
from mmdata.viewer.server import view_server
from tests.test_view import CHROMIUM, page_data, wait_until

EPISODES = 25_000


@pytest.fixture(scope="module")
def large_store(stores, tmp_path_factory):
    """A store of 25,000 episodes: the 3 test episodes' rows repeated in turn over their shards."""
    return write_scaled_store(stores["wds"], tmp_path_factory.mktemp("large") / "large.wds", EPISODES)


@pytest.fixture
def table(large_store, monkeypatch) -> EpisodeTable:
    monkeypatch.setattr(manifest_reader, "EAGER_ROWS", 1000)  # opened as a store too large to read whole is
    store = mmdata.open_store(str(large_store))
    assert not store.manifest.checked_whole
    return EpisodeTable(store)


def test_the_episode_table_sorts_filters_and_pages_over_every_episode(table):
    durations = table.durations
    page = table.page(TableQuery(offset=500, limit=100, sort="duration", ascending=False), lambda i: None)
    expected = np.lexsort((np.arange(EPISODES), -durations))[500:600]
    assert [row["index"] for row in page["rows"]] == expected.tolist()
    assert (page["matched"], page["total"]) == (EPISODES, EPISODES)
    found = table.page(TableQuery(words="EPISODE_024999"), lambda i: f"episode_{i:06d}.html")
    assert [(row["index"], row["page"]) for row in found["rows"]] == [(24999, "episode_024999.html")]
    task = table.rows(np.array([1]), lambda i: None)[0]["task"]
    by_task = table.page(TableQuery(words=task[3:12], limit=5000), lambda i: None)
    assert by_task["matched"] == len(range(1, EPISODES, 3)) and all(r["task"] == task for r in by_task["rows"])
    assert table.page(TableQuery(damaged_only=True), lambda i: None)["matched"] == 0
    by_key = table.page(TableQuery(sort="key", ascending=False, limit=2), lambda i: None)["rows"]
    assert [row["key"] for row in by_key] == ["episode_024999", "episode_024998"]


def test_a_table_query_out_of_range_is_refused_naming_it():
    with pytest.raises(OptionError, match="limit is a whole number from 1 to 5000"):
        TableQuery(limit=0)
    with pytest.raises(OptionError, match="sort is one of"):
        TableQuery(sort="<script>")
    with pytest.raises(OptionError, match="at most 200 characters"):
        TableQuery(words="x" * 201)


def test_a_written_store_page_of_a_large_store_holds_its_first_rows_and_says_so(large_store, tmp_path):
    store = mmdata.open_store(str(large_store))
    data = page_data(write_site(store, tmp_path))
    assert len(data["episodes"]) == INLINE_ROWS and data["truncated"] and data["totals"]["episodes"] == EPISODES
    assert [e["index"] for e in data["episodes"][:3]] == [0, 1, 2]
    segments = [s for row in store.table.column("cam_high/segments").to_pylist() for s in row]
    assert data["totals"]["cam_high"]["bytes"] == sum(segment["size"] for segment in segments)
    assert data["totals"]["state"]["bytes"] == sum(p["size"] for p in store.table.column("state/data").to_pylist())


@pytest.mark.slow
def test_a_served_store_page_pages_sorts_and_filters_a_large_store_in_a_browser(large_store, tmp_path):
    from playwright.sync_api import sync_playwright

    store = mmdata.open_store(str(large_store))
    page_file = write_site(store, tmp_path, link_all=True)
    assert len(page_file.read_bytes()) < 100_000, "the served page holds no rows"
    server = view_server(store, tmp_path, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{origin}/rows.json?limit=999999")
    assert refused.value.code == 400 and "limit" in json.loads(refused.value.read())["error"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"{origin}/index.html")

        def loaded(number: int) -> None:
            wait_until(page, f"document.getElementById('episodes').dataset.loaded === '{number}'")

        loaded(1)
        assert page.locator("#episodes tbody tr").count() == 500
        assert page.locator("#shown").text_content() == "1-500 of 25,000 episodes"
        page.locator("#next").click()
        loaded(2)
        assert page.locator("#episodes tbody tr").first.get_attribute("data-index") == "500"
        page.locator("#filter").fill("episode_024999")
        wait_until(page, "document.getElementById('shown').textContent.startsWith('1-1 of 1 ')")
        row = page.locator("#episodes tbody tr")
        assert row.count() == 1 and row.get_attribute("data-index") == "24999"
        assert row.locator("a").get_attribute("href") == "episode_024999.html"
        browser.close()
    server.shutdown()


def test_the_key_filter_worked_out_on_numbers_matches_searching_the_key_texts(table):
    keys = [f"episode_{index:06d}" for index in range(EPISODES)]
    for words in ("episode_", "de_02", "_0", "024999", "99", "4", "e_1", "x", "episode_0249999", "2499", "\u00b2"):
        assert table.key_mask(words).tolist() == [words in key for key in keys], words

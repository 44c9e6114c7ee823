"""All JSON the viewer writes is strict (no `NaN` or `Infinity`, which JSON does not have): a manifest holding any
values (durations not a number, infinite, huge or negative; counts missing), read whole or by row group, gives pages
and `rows.json` answers that every parser reads, in which every row shows and a row holding such a value is flagged
damaged, in Chromium as written by `--out` and as served."""

from __future__ import annotations

import http.client
import json
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmdata
from mmdata.checks import dump_json
from mmdata.store import manifest_reader
from mmdata.viewer.pages import script_json, write_site
from tests.hostile.tampering import edit_manifest
from tests.hostile.test_viewer_pages import browser, opened, serving  # noqa: F401, F811 (browser: a fixture)


def strictly_parsed(text: str):
    """`text` parsed as JSON that refuses what Python's parser alone accepts (`NaN`, `Infinity`)."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@given(st.recursive(st.floats() | st.text(max_size=5) | st.none(), lambda inner: st.lists(inner, max_size=4)))
def test_the_viewers_json_is_strict_whatever_numbers_it_is_given(value):
    for written in (dump_json({"value": value}), script_json([value, np.array([math.nan, 1.5, math.inf])])):
        parsed = strictly_parsed(written)
        assert parsed is not None


DURATIONS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1.0, 0.0]),
)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    durations=st.lists(DURATIONS, min_size=3, max_size=3),
    missing_count=st.sampled_from([None, 0, 1, 2]),
    lazy=st.booleans(),
)
def test_every_page_parses_and_every_row_shows_whatever_values_the_manifest_holds(
    stores,
    browser,  # noqa: F811
    durations,
    missing_count,
    lazy,
):
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        root = Path(shutil.copytree(stores["wds"], Path(folder) / "store.wds"))

        def change(rows):
            for row, duration in zip(rows, durations):
                row["duration"] = duration
            if missing_count is not None:
                rows[missing_count]["cam_high/count"] = None

        edit_manifest(root, change)
        if lazy:
            patch.setattr(manifest_reader, "EAGER_ROWS", 1)
        store = mmdata.open_store(str(root))
        odd = {i for i, d in enumerate(durations) if not (math.isfinite(d) and 0 <= d <= 7 * 24 * 3600)}
        odd |= {missing_count} if missing_count is not None else set()

        out = Path(folder) / "pages"
        write_site(store, out)
        text = (out / "index.html").read_text()
        strictly_parsed(text.split('<script id="data" type="application/json">')[1].split("</script>")[0])
        with opened(browser, (out / "index.html").as_uri()) as page:
            assert_rows_show(page, odd)

        server, origin = serving(store, Path(folder) / "served")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
            connection.request("GET", "/rows.json?offset=0&limit=10&sort=duration")
            answer = strictly_parsed(connection.getresponse().read().decode())
            assert sorted(row["index"] for row in answer["rows"]) == [0, 1, 2]
            with opened(browser, f"{origin}/index.html") as page:
                assert_rows_show(page, odd)
        finally:
            server.shutdown()
            server.server_close()


def assert_rows_show(page, damaged: set[int]) -> None:
    """Every episode's row shows, and those of `damaged` are flagged, with no error in the page's console."""
    page.wait_for_selector("#episodes tbody tr")
    indexes = page.locator("#episodes tbody tr").evaluate_all("rows => rows.map(r => Number(r.dataset.index))")
    flagged = page.locator("#episodes tbody tr.damaged").evaluate_all("rows => rows.map(r => Number(r.dataset.index))")
    assert sorted(indexes) == [0, 1, 2], indexes
    assert set(flagged) >= damaged, (flagged, damaged)
    assert not [event for event in page.events if "Uncaught" in event or "SyntaxError" in event], page.events

"""`mmdata view`: a camera's stored segments remuxed into one playable file without re-encoding; a store page
listing every episode from the manifest, damaged ones flagged; episode pages with everything they load in their
folder; and both pages driven in a real browser (Debian's Chromium through Playwright) with outside requests
blocked."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import threading
import time

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

import mmdata
from mmdata.codecs.colour import to_rgb
from mmdata.codecs.video_encode import VideoEncoding
from mmdata.conversion.encode import EncodeOptions
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.importers.raw import discover_raw_episodes
from mmdata.store.manifest import packets_column
from mmdata.store.remux import write_episode_video
from mmdata.synthetic import read_index_stripe
from mmdata.tools.cli import main
from mmdata.viewer.pages import write_episode_page, write_site
from mmdata.viewer.server import view_server
from tests.test_packet_decoding import store_with_manifest

CHROMIUM = os.environ.get("MMDATA_CHROMIUM", "/usr/bin/chromium")


def wait_until(page, expression: str, timeout_s: float = 30.0) -> None:
    """Poll `expression` (JavaScript) in `page` until it holds. Playwright's own `wait_for_function` evaluates its
    predicate with `eval`, which the viewer's Content-Security-Policy forbids; `evaluate` goes through the
    debugging protocol, which it does not."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{expression} did not hold within {timeout_s} s")
        time.sleep(0.02)


def page_data(path) -> dict:
    found = re.search(r'<script id="data" type="application/json">(.*?)</script>', path.read_text(), re.S)
    return json.loads(found.group(1).replace("<\\/", "</"))


@pytest.fixture
def damaged_store(stores, tmp_path):
    """The test store with episode 1's packet index cut short: a row the store's checks flag."""
    table = pq.read_table(stores["wds"] / "episodes.parquet")
    rows = table.to_pylist()
    column = packets_column("cam_high")
    rows[1][column][0] = {**rows[1][column][0], "packets": rows[1][column][0]["packets"][:-16]}
    manifest = type(table).from_pylist(rows, schema=table.schema)
    copy = store_with_manifest(stores["wds"], tmp_path / "store.wds", manifest)
    shutil.copyfile(stores["wds"] / "stats.json", copy / "stats.json")
    return copy


@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_a_camera_is_remuxed_without_re_encoding_into_every_frame_of_its_episode(stores, layout, tmp_path):
    store = mmdata.open_store(str(stores[layout]))
    video = write_episode_video(store, 2, "cam_high", tmp_path / "cam_high")
    with av.open(str(video.path)) as container:
        frames = np.stack([to_rgb(frame) for frame in container.decode(video=0)])
    stored = mmdata.open_dataset(str(stores[layout])).read_episode(2, ["cam_high"])["cam_high"].values
    assert video.mime == "video/mp4" and video.frames == len(stored)
    assert np.array_equal(frames, stored), "the very frames the store decodes to: no re-encoding"
    assert not list(tmp_path.glob("*.partial.*"))


@pytest.fixture(scope="module")
def codec_stores(raw_dataset, tmp_path_factory) -> dict[str, mmdata.Store]:
    """The raw dataset converted with VP9 and with HEVC segments."""
    found = {}
    for codec in ("vp9", "hevc"):
        destination = tmp_path_factory.mktemp("codecs") / f"{codec}.wds"
        encode = EncodeOptions(video=VideoEncoding(codec=codec))
        convert(discover_raw_episodes(raw_dataset), destination, ConvertOptions(encode=encode, progress=False))
        found[codec] = mmdata.open_store(str(destination))
    return found


@pytest.mark.slow
def test_vp9_goes_into_webm_unchanged_and_hevc_into_h264_for_browsers(codec_stores, tmp_path):
    vp9 = write_episode_video(codec_stores["vp9"], 0, "cam_high", tmp_path / "vp9", playable_in_browsers=True)
    with av.open(str(vp9.path)) as container:
        assert container.streams.video[0].codec_context.name in ("vp9", "libvpx-vp9")
        frames = np.stack([to_rgb(frame) for frame in container.decode(video=0)])
    stored = mmdata.Dataset(codec_stores["vp9"]).read_episode(0, ["cam_high"])["cam_high"].values
    assert vp9.mime == "video/webm" and vp9.path.suffix == ".webm" and np.array_equal(frames, stored)

    hevc = codec_stores["hevc"]
    remuxed = write_episode_video(hevc, 0, "cam_high", tmp_path / "hevc")
    playable = write_episode_video(hevc, 0, "cam_high", tmp_path / "h264", playable_in_browsers=True)
    stored = mmdata.Dataset(hevc).read_episode(0, ["cam_high"])["cam_high"].values
    for video, codec in ((remuxed, "hevc"), (playable, "h264")):
        with av.open(str(video.path)) as container:
            assert container.streams.video[0].codec_context.name == codec
            frames = np.stack([to_rgb(frame) for frame in container.decode(video=0)])
        assert video.frames == len(stored) == len(frames)
        difference = np.abs(frames.astype(float) - stored).mean()
        assert difference == 0 if codec == "hevc" else difference < 2.0, (codec, difference)


def test_the_store_page_lists_every_episode_from_the_manifest_and_flags_the_damaged(damaged_store, tmp_path):
    store = mmdata.open_store(str(damaged_store))
    page = write_site(store, tmp_path / "view", [0])
    data = page_data(page)
    durations = store.table.column("duration").to_pylist()
    assert [e["index"] for e in data["episodes"]] == list(range(len(durations)))
    assert [e["duration"] for e in data["episodes"]] == [round(d, 3) for d in durations]
    assert data["episodes"][1]["damaged"] and not data["episodes"][0]["damaged"]
    assert data["episodes"][0]["page"] == "episode_000000.html" and data["episodes"][2]["page"] is None
    assert set(data["stats"]) == {"state", "action"}


def test_an_episode_page_holds_its_streams_and_loads_nothing_from_outside_its_folder(stores, tmp_path):
    store = mmdata.open_store(str(stores["wds"]))
    page = write_episode_page(store, 0, tmp_path)
    data = page_data(page)
    assert [c["name"] for c in data["cameras"]] == ["cam_high", "cam_wrist"]
    assert {s["name"] for s in data["series"]} == {"state", "action"} and data["audio"]["peaks"]
    for camera in data["cameras"]:
        assert (tmp_path / camera["src"]).exists() and len(camera["times"]) == camera["frames"]
    for text in (
        [page.read_text(), *(p.read_text() for p in (tmp_path / "static").glob("*"))]
        if (tmp_path / "static").exists()
        else [page.read_text()]
    ):
        assert not re.search(r"(src|href)=\"(https?:)?//", text), "no request leaves the folder"


def test_an_episode_outside_the_store_or_damaged_is_refused_naming_it(damaged_store, tmp_path):
    store = mmdata.open_store(str(damaged_store))
    with pytest.raises(mmdata.MmdataError, match="episode 99 is not in the store: it has 3"):
        write_episode_page(store, 99, tmp_path)
    with pytest.raises(mmdata.MmdataError, match="episode 1 is damaged: .*mmdata verify"):
        write_episode_page(store, 1, tmp_path)


def test_mmdata_view_writes_the_pages_it_is_asked_for(stores, tmp_path, capsys):
    assert main(["view", str(stores["zarr"]), "--episode", "1", "--out", str(tmp_path)]) == 0
    assert "file://" in capsys.readouterr().out
    assert (tmp_path / "index.html").exists() and (tmp_path / "episode_000001.html").exists()
    assert main(["view", str(stores["zarr"]), "--episode", "7", "--out", str(tmp_path)]) == 2


def test_an_episode_as_a_rerun_recording_read_back_with_rerun(stores, tmp_path):
    from rerun.chunk import RrdReader

    path = tmp_path / "episode.rrd"
    assert main(["view", str(stores["wds"]), "--episode", "1", "--rerun", str(path)]) == 0
    chunks = RrdReader(path).store().stream().to_chunks()
    rows: dict[str, int] = {}
    for chunk in chunks:
        if not chunk.is_static:
            rows[str(chunk.entity_path)] = rows.get(str(chunk.entity_path), 0) + chunk.num_rows
    store = mmdata.open_store(str(stores["wds"]))
    row = store.manifest.row(1)
    assert rows == {
        "/cam_high": row["cam_high/count"],
        "/cam_wrist": row["cam_wrist/count"],
        "/state": row["state/count"],
        "/action": row["action/count"],
    }
    static = {str(c.entity_path) for c in chunks if c.is_static}
    assert {"/cam_high", "/cam_wrist", "/task"} <= static
    state = next(c for c in chunks if str(c.entity_path) == "/state").to_record_batch()
    logged = np.asarray(state.column("Scalars:scalars").to_pylist(), np.float64)
    stored = store.lowdim_span(1, "state", -np.inf, np.inf).values
    assert np.array_equal(logged, np.asarray(stored, np.float64).reshape(len(stored), -1))
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.slow
def test_both_pages_in_a_real_browser_offline(damaged_store, tmp_path):
    from playwright.sync_api import sync_playwright

    store = mmdata.open_store(str(damaged_store))
    write_site(store, tmp_path, link_all=True)  # the server makes an episode's page when it is first opened
    server = view_server(store, tmp_path, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    row = store.manifest.row(0)
    fps = store.schema.stream("cam_high").fps
    outside = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.route(
            re.compile(rf"^(?!{re.escape(origin)}/).*"),
            lambda route: (outside.append(route.request.url), route.abort()),
        )
        page.goto(f"{origin}/index.html")
        wait_until(page, "document.getElementById('episodes').dataset.loaded === '1'")  # rows asked of the server
        cells = page.locator("#episodes tbody tr td[data-column=duration]").all_text_contents()
        assert [float(c) for c in cells] == [round(d, 3) for d in store.table.column("duration").to_pylist()]
        assert "damaged" in page.locator("#episodes tbody tr[data-index='1']").get_attribute("class")
        assert page.locator("canvas.stats").count() == 2, "a statistics chart per low-dim stream"
        page.locator("th[data-column=duration]").click()
        wait_until(page, "document.getElementById('episodes').dataset.loaded === '2'")
        ordered = [float(c) for c in page.locator("#episodes tbody td[data-column=duration]").all_text_contents()]
        assert ordered == sorted(ordered)

        page.locator("#episodes tbody tr[data-index='0'] a").click()
        page.wait_for_url(f"{origin}/episode_000000.html")
        wait_until(page, "[...document.querySelectorAll('video')].every(v => v.readyState >= 2)")
        durations = page.evaluate("[...document.querySelectorAll('video')].map(v => v.duration)")
        assert len(durations) == 2 and all(abs(d - row["duration"]) <= 1 / fps for d in durations)

        def drawn_frame() -> int:
            pixels = page.evaluate(
                """() => { const v = document.querySelector('video'); const c = document.createElement('canvas');
                c.width = v.videoWidth; c.height = v.videoHeight; const x = c.getContext('2d');
                x.drawImage(v, 0, 0); return Array.from(x.getImageData(0, 0, c.width, c.height).data); }"""
            )
            rgba = np.asarray(pixels, np.uint8).reshape(224, 224, 4)
            return read_index_stripe(rgba[:, :, :3])

        page.keyboard.press(" ")
        wait_until(page, "document.querySelector('video').currentTime > 0.2")
        page.keyboard.press(" ")
        wait_until(
            page,
            f"""() => {{ const v = document.querySelector('video');
            const frame = Math.floor(v.currentTime * {fps} + 1e-3);
            return v.paused && !v.seeking && document.getElementById('frame').textContent == frame; }}""",
        )
        before = int(page.locator("#frame").text_content())
        assert drawn_frame() == before
        page.keyboard.press("ArrowRight")
        wait_until(page, f"document.getElementById('frame').textContent == '{before + 1}'")
        wait_until(page, "!document.querySelector('video').seeking")
        assert drawn_frame() == before + 1

        plot = page.locator("canvas.plot").first
        box = plot.bounding_box()
        data = page_data(tmp_path / "episode_000000.html")
        target = data["t0"] + 0.5 * (data["t1"] - data["t0"])
        plot.click(position={"x": box["width"] * 0.5, "y": box["height"] / 2})
        wait_until(page, "!document.querySelector('video').seeking")
        times = page.evaluate("[...document.querySelectorAll('video')].map(v => v.currentTime)")
        assert all(abs(t - (target - data["t0"])) <= 1 / fps + 1e-6 for t in times), (times, target)
        assert drawn_frame() == int(page.locator("#frame").text_content())

        shot = page.screenshot(path=str(tmp_path / "episode.png"), full_page=True)
        browser.close()
    server.shutdown()
    assert not outside, outside
    picture = np.asarray(Image.open(io.BytesIO(shot)).convert("L"), np.float64)
    assert picture.std() > 20, "the screenshot shows the page, not a blank"

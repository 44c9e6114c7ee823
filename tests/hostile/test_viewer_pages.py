"""`mmdata view` on stores whose text was written to attack a browser: stream names, tasks and metadata that
would end an attribute, a <script> element or a comment are shown as text, no script but the viewer's runs
(the pages are escaped by context and carry a Content-Security-Policy that allows only the viewer's script),
and every row shows. Its server streams ranges in bounded chunks, keeps its status line and headers to fixed
text whatever a store's path holds, and says when its port is taken; `--out` is never a file or the store."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import string
import tempfile
import threading
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmdata
from mmdata.checks import stream_name_problem
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.importers.raw import discover_raw_episodes
from mmdata.synthetic import synthetic_frame
from mmdata.tools.cli import main
from mmdata.viewer.pages import script_json, write_episode_page, write_site
from mmdata.viewer.server import view_server
from tests.test_view import wait_until

CHROMIUM = os.environ.get("MMDATA_CHROMIUM", "/usr/bin/chromium")
INJECTED_NAME = "x\" onerror=\"window.pwned=true;document.title='pwned';String"
ATTACKS = [
    INJECTED_NAME,
    "<!--<script>",
    "</script><script>window.pwned=true</script>",
    "<img src=x onerror=window.pwned=true>",
    "'><svg onload=window.pwned=true>",
    "\u2028\u2029</title><script>document.title='pwned'</script>",
    "]]><!-- -->&amp;&lt;",
    "${window.pwned=true}",
]


def write_raw(root: Path, cameras: list[str], lowdim: list[str], tasks: list[str], metadata: list[dict]) -> Path:
    """Episodes of a few 32x32 frames per camera (named as given), low-dim streams and meta.json texts."""
    for number, (task, meta) in enumerate(zip(tasks, metadata)):
        folder = root / f"episode_{number:03d}"
        folder.mkdir(parents=True)
        for camera_number, camera in enumerate(cameras):
            with av.open(str(folder / f"{camera}.mp4"), "w") as output:
                stream = output.add_stream("libx264", rate=Fraction(10))
                stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
                for frame in range(6):
                    picture = synthetic_frame(frame, camera_number, 32, 32)
                    output.mux(stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
                output.mux(stream.encode(None))
        for name in lowdim:
            np.save(folder / f"{name}.npy", np.linspace(0, 1, 12, dtype=np.float32).reshape(6, 2))
        rates = dict.fromkeys(lowdim, 10.0)
        (folder / "meta.json").write_text(json.dumps({"task": task, "rates": rates, "metadata": meta}))
    return root


def converted(root: Path, destination: Path) -> Path:
    convert(discover_raw_episodes(root), destination, ConvertOptions(workers=1, progress=False))
    return destination


@pytest.fixture(scope="module")
def browser():
    pytest.importorskip("playwright")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@contextlib.contextmanager
def opened(browser, url: str):
    """A new page at `url`, with what it tried: dialogs, console errors and CSP violations recorded; closed when
    the block ends, whatever happens in it (hypothesis runs many examples in one browser)."""
    page = browser.new_page()
    try:
        page.events = []
        page.on("dialog", lambda dialog: (page.events.append(f"dialog {dialog.message}"), dialog.dismiss()))
        page.on("console", lambda message: page.events.append(f"console {message.type} {message.text}"))
        page.goto(url)
        page.wait_for_load_state("load")
        yield page
    finally:
        page.close()


def assert_only_the_viewers_script_ran(page) -> None:
    found = page.evaluate(
        """() => ({
        pwned: window.pwned === true,
        title: document.title,
        scripts: [...document.scripts].map(s => s.id || s.getAttribute('src')),
        handlers: [...document.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name))
            .filter(n => n.startsWith('on')),
        })"""
    )
    assert not found["pwned"] and "pwned" not in found["title"], found
    assert found["scripts"] == ["data", "static/viewer.js"], found
    assert not found["handlers"], found
    assert not [e for e in page.events if e.startswith("dialog")], page.events


def assert_every_row_shows(page, store: mmdata.Store) -> None:
    tasks = store.table.column("task").to_pylist()
    cells = page.locator("#episodes tbody td[data-column=task]").all_text_contents()
    assert cells == tasks, (cells, tasks)


def serving(store: mmdata.Store, out: Path):
    write_site(store, out, link_all=True)
    server = view_server(store, out, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture(scope="module")
def attacked_store(tmp_path_factory) -> mmdata.Store:
    """A store whose camera is named to break out of an attribute, its tasks and metadata the ATTACKS."""
    root = tmp_path_factory.mktemp("attacked")
    tasks = [ATTACKS[1], ATTACKS[2], ATTACKS[5]]
    metadata = [{"note": attack} for attack in tasks]
    write_raw(root / "raw", [INJECTED_NAME], ["<b onmouseover=alert(1)>state"], tasks, metadata)
    return mmdata.open_store(str(converted(root / "raw", root / "store.wds")))


@pytest.mark.slow
def test_a_stream_name_made_to_run_script_stays_text_in_written_pages(attacked_store, browser, tmp_path):
    out = tmp_path / "pages"
    assert main(["view", attacked_store.url, "--episode", "0", "--episode", "1", "--out", str(out)]) == 0
    for name in ("index.html", "episode_000000.html", "episode_000001.html"):
        with opened(browser, (out / name).as_uri()) as page:
            assert_only_the_viewers_script_ran(page)
            if name == "index.html":
                assert_every_row_shows(page, attacked_store)
            else:
                assert page.locator("video").get_attribute("data-camera") == INJECTED_NAME
                wait_until(page, "document.querySelector('video').readyState >= 2")  # its file found and played
                task = attacked_store.table.column("task")[int(name[8:14])].as_py()
                assert page.locator("#task").text_content() == task


@pytest.mark.slow
def test_a_stream_name_made_to_run_script_stays_text_in_served_pages(attacked_store, browser, tmp_path):
    server, origin = serving(attacked_store, tmp_path / "served")
    try:
        for name in ("index.html", "episode_000002.html"):
            with opened(browser, f"{origin}/{name}") as page:
                assert_only_the_viewers_script_ran(page)
                if name == "index.html":
                    assert_every_row_shows(page, attacked_store)
                else:
                    wait_until(page, "document.querySelector('video').readyState >= 2")
        connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        connection.request("GET", "/index.html")
        policy = connection.getresponse().getheader("Content-Security-Policy")
        assert "script-src 'self'" in policy and "default-src 'none'" in policy
    finally:
        server.shutdown()
        server.server_close()


@given(st.text())
def test_page_data_holds_any_text_without_characters_that_end_its_script_element(text):
    embedded = script_json({"task": text, text: [text]})
    assert not set(embedded) & {"<", ">", "&", "\u2028", "\u2029"}
    assert json.loads(embedded) == {"task": text, text: [text]}


def stream_names():
    """Stream names a store accepts and a file system can hold, written to look like markup."""
    pieces = st.one_of(st.sampled_from(["<", ">", '"', "'", "&", "=", " on", "!--", "script", "`", "${"]), st.text())
    return (
        st.lists(pieces, min_size=1, max_size=5)
        .map("".join)
        .filter(lambda name: stream_name_problem(name) is None and len(name.encode()) < 120)
        .filter(lambda name: name.lower() not in ("audio", "task", "lowdim") and "\x00" not in name)
    )


def texts():
    return st.one_of(st.sampled_from(ATTACKS), st.text(max_size=80), st.lists(st.sampled_from(ATTACKS)).map("".join))


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    names=st.lists(stream_names(), min_size=2, max_size=2, unique_by=str.lower),
    tasks=st.lists(texts(), min_size=2, max_size=2),
    notes=st.lists(st.dictionaries(texts(), texts(), max_size=2), min_size=2, max_size=2),
)
def test_pages_of_stores_holding_any_text_run_only_the_viewers_script_and_show_every_row(browser, names, tasks, notes):
    camera, lowdim = names
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        store = mmdata.open_store(str(converted(write_raw(root / "raw", [camera], [lowdim], tasks, notes), root / "s")))
        write_site(store, root / "pages", [0, 1])
        with opened(browser, (root / "pages" / "index.html").as_uri()) as index:
            assert_only_the_viewers_script_ran(index)
            assert_every_row_shows(index, store)
            assert index.locator("canvas.stats").count() == 1, "the low-dim stream's statistics drawn"
        with opened(browser, (root / "pages" / "episode_000001.html").as_uri()) as episode:
            assert_only_the_viewers_script_ran(episode)
            assert episode.locator("video").get_attribute("data-camera") == camera
            assert episode.locator("#task").text_content() == tasks[1]
            assert json.loads(episode.locator("pre").text_content()) == store.metadata_of(store.manifest.row(1))
            wait_until(episode, "document.querySelector('video').readyState >= 2")


def test_malformed_statistics_leave_their_stream_out_of_the_page(stores, tmp_path):
    store_path = shutil.copytree(stores["wds"], tmp_path / "store.wds")
    stats = json.loads((store_path / "stats.json").read_text())
    stats["lowdim"]["state"]["min"] = ["<script>", "x"]
    (store_path / "stats.json").write_text(json.dumps(stats))
    page = write_site(mmdata.open_store(str(store_path)), tmp_path / "pages")
    data = json.loads(re.search(r'type="application/json">(.*?)</script>', page.read_text(), re.S).group(1))
    assert set(data["stats"]) == {"action"}


@pytest.mark.slow
def test_ranges_are_streamed_in_bounded_chunks_while_clients_read_nothing(stores, tmp_path):
    store = mmdata.open_store(str(stores["wds"]))
    server, _ = serving(store, tmp_path / "served")
    big = tmp_path / "served" / "media" / "big.bin"
    big.parent.mkdir(parents=True, exist_ok=True)
    with open(big, "wb") as handle:
        handle.truncate(96 << 20)
    idle = []
    try:
        before = resident_bytes()
        for _ in range(6):
            client = socket.create_connection(server.server_address[:2])
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.sendall(b"GET /media/big.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-\r\n\r\n")
            idle.append(client)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += idle[0].recv(4096)
        assert answer.startswith(b"HTTP/1.0 206") and b"Content-Length: 100663296" in answer
        threading.Event().wait(1.0)
        grown = resident_bytes() - before
        assert grown < 48 << 20, f"the server grew by {grown >> 20} MB for 6 idle readers of a 96 MB file"
    finally:
        for client in idle:
            client.close()
        server.shutdown()
        server.server_close()


def resident_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize(
    ("header", "status"),
    [("bytes=0-" + "9" * 5000, 200), ("bytes=" + "9" * 30 + "-", 200), ("bytes=10-5", 416), ("bytes=-100", 206)],
)
@pytest.mark.slow
def test_odd_ranges_are_answered_without_a_traceback(stores, tmp_path, header, status):
    store = mmdata.open_store(str(stores["wds"]))
    server, _ = serving(store, tmp_path / "served")
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        connection.request("GET", "/static/viewer.js", headers={"Range": header})
        response = connection.getresponse()
        body = response.read()
        assert response.status == status
        size = (tmp_path / "served" / "static" / "viewer.js").stat().st_size
        assert len(body) == {200: size, 416: 0, 206: 100}[status]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_a_store_path_with_line_breaks_and_other_scripts_never_reaches_a_header(stores, tmp_path):
    import pyarrow.parquet as pq

    from tests.hostile.tampering import edit_manifest

    folder = tmp_path / "Ünïcode ✓\r\nX-Injected: yes"
    shutil.copytree(stores["wds"], folder)
    edit_manifest(folder, lambda rows: rows[1].update(duration=float("nan")))
    assert pq.read_table(folder / "episodes.parquet").num_rows == 3
    store = mmdata.open_store(str(folder))
    assert 1 in store.damaged and "\r\n" in store.url
    server, _ = serving(store, tmp_path / "served")
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        connection.request("GET", "/episode_000001.html")
        response = connection.getresponse()
        body = response.read().decode()
        assert (response.status, response.reason) == (404, "episode page not available")
        assert response.getheader("X-Injected") is None
        assert "episode 1 is damaged" in body and "Ünïcode ✓" in body
    finally:
        server.shutdown()
        server.server_close()


def test_a_port_in_use_is_named_with_the_way_round(stores, tmp_path, capsys):
    with contextlib.closing(socket.socket()) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["view", str(stores["wds"]), "--serve", "--port", str(port)]) == 2
    error = capsys.readouterr().err
    assert f"--port {port}: another program is listening" in error and "--port 0" in error
    assert "Traceback" not in error


def test_out_that_is_a_file_or_inside_the_store_is_refused(stores, tmp_path, capsys):
    store = shutil.copytree(stores["wds"], tmp_path / "store.wds")
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    assert main(["view", str(store), "--out", str(existing)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err and existing.read_text() == "mine"
    for inside in (store, store / "pages"):
        assert main(["view", str(store), "--out", str(inside)]) == 2
        assert "lies inside the store" in capsys.readouterr().err
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before


def test_episode_pages_write_only_inside_their_folder(attacked_store, tmp_path):
    out = tmp_path / "pages"
    write_episode_page(attacked_store, 0, out)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and all(out in p.parents for p in written)
    assert set(string.printable) >= set("".join(p.name for p in written if p.suffix == ".html"))

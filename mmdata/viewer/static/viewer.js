// mmdata view: the store page (a sortable, filterable episode table, totals, statistics) and an episode
// page (cameras playing in sync, low-dim plots with a cursor that follows and seeks the videos, the audio's
// waveform). Everything it shows is in the page's <script id="data"> block, but for a served store page's rows,
// which it asks its own server for a page at a time (rows.json): no request leaves the folder or the server.
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);

function element(tag, attributes = {}, text = null) {
  const made = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) made.setAttribute(name, value);
  if (text !== null) made.textContent = text;
  return made;
}

function storePage() {
  const table = document.getElementById("episodes");
  const filter = document.getElementById("filter");
  const damagedOnly = document.getElementById("damaged-only");
  const shown = document.getElementById("shown");
  const columns = DATA.columns;
  let sortKey = "index", ascending = true, offset = 0, asked = 0;
  function fill(rows) {
    const body = table.querySelector("tbody");
    body.replaceChildren();
    for (const episode of rows) {
      const row = element("tr", { "data-index": episode.index, class: episode.damaged ? "damaged" : "" });
      for (const column of columns) {
        const cell = element("td", { "data-column": column });
        if (column === "key" && episode.page) cell.append(element("a", { href: episode.page }, episode.key));
        else if (column === "damaged") cell.append(element("span", { class: "flag", title: episode.damaged || "" }, episode.damaged ? "damaged" : ""));
        else cell.textContent = episode[column];
        row.append(cell);
      }
      body.append(row);
    }
  }
  // A served page asks the server for one page of the whole table, sorted and filtered there.
  async function fetchPage() {
    const number = ++asked;
    const parameters = new URLSearchParams({
      offset, limit: DATA.page_rows, sort: sortKey, order: ascending ? "asc" : "desc", q: filter.value,
      damaged: damagedOnly.checked ? "1" : "",
    });
    const answer = await (await fetch(`${DATA.rows_url}?${parameters}`)).json();
    if (number !== asked) return;  // a later request was made meanwhile: its answer is the one to show
    if (answer.error) { shown.textContent = answer.error; return; }
    fill(answer.rows);
    const last = offset + answer.rows.length;
    shown.textContent = answer.matched
      ? `${(offset + 1).toLocaleString()}-${last.toLocaleString()} of ${answer.matched.toLocaleString()} episodes` +
        (answer.matched < answer.total ? ` (of ${answer.total.toLocaleString()})` : "")
      : `0 of ${answer.total.toLocaleString()} episodes`;
    document.getElementById("previous").disabled = offset === 0;
    document.getElementById("next").disabled = last >= answer.matched;
    table.dataset.loaded = String(number);
  }
  function renderInline() {
    const words = filter.value.toLowerCase();
    const rows = DATA.episodes
      .filter((e) => (!damagedOnly.checked || e.damaged) && (!words || `${e.key} ${e.task}`.toLowerCase().includes(words)))
      .sort((a, b) => (a[sortKey] < b[sortKey] ? -1 : a[sortKey] > b[sortKey] ? 1 : 0) * (ascending ? 1 : -1));
    fill(rows);
    shown.textContent = `${rows.length} of ${DATA.episodes.length} episodes` +
      (DATA.truncated ? ` (the first ${DATA.episodes.length.toLocaleString()} of ${DATA.totals.episodes.toLocaleString()}: mmdata view --serve pages through them all)` : "");
  }
  const render = DATA.rows_url ? fetchPage : renderInline;
  function again() { offset = 0; render(); }
  if (DATA.rows_url) {
    document.getElementById("pager").hidden = false;
    document.getElementById("previous").addEventListener("click", () => { offset = Math.max(0, offset - DATA.page_rows); render(); });
    document.getElementById("next").addEventListener("click", () => { offset += DATA.page_rows; render(); });
  }
  table.querySelectorAll("th").forEach((header) =>
    header.addEventListener("click", () => {
      const key = header.dataset.column;
      ascending = key === sortKey ? !ascending : true;
      sortKey = key;
      again();
    }));
  let typing = null;  // a served table is asked again once typing pauses, not at every key
  filter.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(again, DATA.rows_url ? 200 : 0);
  });
  damagedOnly.addEventListener("change", again);
  render();
  drawStatistics();
}

// Per stream, a row per dimension: its min .. max as a line, q01 .. q99 as a box, the mean as a dot and
// mean ± std as a bar, each dimension on its own scale (the figures are printed beside it).
function drawStatistics() {
  const holder = document.getElementById("stat-plots");
  for (const [name, figures] of Object.entries(DATA.stats)) {
    const dims = (figures.mean || []).length;
    if (!dims) continue;
    const row = 18, canvas = element("canvas", { class: "stats", width: 900, height: dims * row + 6, "data-stream": name });
    holder.append(element("h3", {}, `${name} (${figures.count ?? "?"} values)`), canvas);
    const context = canvas.getContext("2d");
    const left = 60, width = 520;
    for (let d = 0; d < dims; d++) {
      const low = figures.min[d], high = figures.max[d], span = high - low || 1;
      const at = (value) => left + ((value - low) / span) * width;
      const y = 4 + d * row + row / 2;
      context.fillStyle = "#222";
      context.font = "11px sans-serif";
      context.fillText(`[${d}]`, 4, y + 4);
      context.strokeStyle = "#999";
      context.beginPath(); context.moveTo(at(low), y); context.lineTo(at(high), y); context.stroke();
      if (figures.q01 && figures.q99) {
        context.fillStyle = "#cfe0ee";
        context.fillRect(at(figures.q01[d]), y - 5, Math.max(1, at(figures.q99[d]) - at(figures.q01[d])), 10);
      }
      context.fillStyle = "#3b75af";
      context.fillRect(at(figures.mean[d] - figures.std[d]), y - 2, Math.max(1, 2 * figures.std[d] / span * width), 4);
      context.beginPath(); context.arc(at(figures.mean[d]), y, 3, 0, 2 * Math.PI); context.fill();
      context.fillStyle = "#222";
      const text = `${low.toPrecision(3)} .. ${high.toPrecision(3)}  mean ${figures.mean[d].toPrecision(3)} ± ${figures.std[d].toPrecision(3)}`;
      context.fillText(text, left + width + 12, y + 4);
    }
  }
}

function episodePage() {
  // the task as stored: text the HTML parser would change (a NUL dropped, CR made LF) comes from the data
  document.getElementById("task").textContent = DATA.task;
  const videos = [...document.querySelectorAll("video")];
  const main = videos[0];
  const fps = DATA.fps;
  const times = DATA.frame_times;  // the stored time of each frame of the first camera
  const frameLabel = document.getElementById("frame");
  const frameAt = (seconds) => Math.min(times.length - 1, Math.max(0, Math.floor(seconds * fps + 1e-3)));
  function seekFrame(frame) {
    frame = Math.min(times.length - 1, Math.max(0, frame));
    for (const video of videos) video.currentTime = (frame + 0.5) / fps;
    draw();
  }
  function nearestFrame(time) {
    let best = 0;
    for (let i = 1; i < times.length; i++) if (Math.abs(times[i] - time) < Math.abs(times[best] - time)) best = i;
    return best;
  }
  const plots = DATA.series.map((series) => {
    const canvas = element("canvas", { class: "plot", width: 900, height: 160, "data-stream": series.name });
    document.getElementById("plots").append(element("h3", {}, `${series.name} (${series.values[0] ? series.values[0].length : 0} dims)`), canvas);
    canvas.addEventListener("click", (event) => {
      const box = canvas.getBoundingClientRect();
      const time = DATA.t0 + ((event.clientX - box.left) / box.width) * (DATA.t1 - DATA.t0);
      for (const video of videos) video.pause();
      seekFrame(nearestFrame(time));
    });
    return { series, canvas };
  });
  const wave = document.getElementById("waveform");
  function x(canvas, time) { return ((time - DATA.t0) / (DATA.t1 - DATA.t0)) * canvas.width; }
  function drawSeries({ series, canvas }, cursor) {
    const context = canvas.getContext("2d");
    context.clearRect(0, 0, canvas.width, canvas.height);
    const flat = series.values.flat().filter(Number.isFinite);
    const low = Math.min(...flat), high = Math.max(...flat), span = high - low || 1;
    const dims = series.values[0] ? series.values[0].length : 0;
    for (let d = 0; d < dims; d++) {
      context.strokeStyle = `hsl(${(d * 47) % 360}, 60%, 45%)`;
      context.beginPath();
      let drawing = false;  // a value that is not a number (null in the page's data) leaves a gap in the line
      series.times.forEach((time, i) => {
        const value = series.values[i][d];
        if (!Number.isFinite(value) || !Number.isFinite(time)) { drawing = false; return; }
        const y = canvas.height - 4 - ((value - low) / span) * (canvas.height - 8);
        drawing ? context.lineTo(x(canvas, time), y) : context.moveTo(x(canvas, time), y);
        drawing = true;
      });
      context.stroke();
    }
    context.strokeStyle = "#d00";
    context.beginPath();
    context.moveTo(x(canvas, cursor), 0);
    context.lineTo(x(canvas, cursor), canvas.height);
    context.stroke();
  }
  function drawWave(cursor) {
    if (!wave || !DATA.audio) return;
    const context = wave.getContext("2d");
    context.clearRect(0, 0, wave.width, wave.height);
    context.fillStyle = "#58a";
    const peaks = DATA.audio.peaks, middle = wave.height / 2;
    peaks.forEach((peak, i) => {
      const left = x(wave, DATA.audio.t0 + (i / peaks.length) * DATA.audio.duration);
      context.fillRect(left, middle - peak * middle, Math.max(1, wave.width / peaks.length), 2 * peak * middle);
    });
    context.fillStyle = "#d00";
    context.fillRect(x(wave, cursor), 0, 1, wave.height);
  }
  function draw() {
    const frame = frameAt(main.currentTime);
    frameLabel.textContent = frame;
    for (const plot of plots) drawSeries(plot, times[frame]);
    drawWave(times[frame]);
  }
  main.addEventListener("timeupdate", () => {
    for (const video of videos.slice(1))
      if (Math.abs(video.currentTime - main.currentTime) > 0.5 / fps) video.currentTime = main.currentTime;
    draw();
  });
  main.addEventListener("seeked", draw);
  // paused, the videos rest in the middle of the frame the label names (a pause lands between frames)
  main.addEventListener("pause", () => seekFrame(frameAt(main.currentTime)));
  function toggle() {
    if (main.paused) videos.forEach((video) => video.play());
    else videos.forEach((video) => video.pause());
  }
  document.addEventListener("keydown", (event) => {
    if (event.key === " ") { event.preventDefault(); toggle(); }
    else if (event.key === "ArrowRight" || event.key === "ArrowLeft") {
      event.preventDefault();
      videos.forEach((video) => video.pause());
      seekFrame(frameAt(main.currentTime) + (event.key === "ArrowRight" ? 1 : -1));
    }
  });
  document.getElementById("play").addEventListener("click", toggle);
  const tick = () => { if (!main.paused) draw(); requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
  draw();
}

if (DATA.page === "store") storePage(); else episodePage();

"""An episode as a Rerun recording (`.rrd`), to open in the Rerun viewer beside a robot's other logs.

Cameras stored as H.264 or HEVC go in as video assets (the stored packets, remuxed: `mmdata.viewer.remux`)
with a frame reference at each frame's stored time; VP9 cameras, which Rerun's video asset does not take,
as their decoded frames. Low-dim streams become scalar series, the task a text document, all on the
episode's own timeline, `time` (seconds, as stored).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np

from mmdata.errors import MmdataError
from mmdata.schema import LowdimStream, VideoStream
from mmdata.store.dataset import Dataset
from mmdata.store.handle import Store
from mmdata.store.remux import write_episode_video

TIMELINE = "time"


def write_rerun_recording(store: Store, index: int, path: Path) -> Path:
    """Episode `index` of `store` as the Rerun recording `path` (written beside and renamed when complete)."""
    try:
        import rerun as rr
    except ImportError as exc:
        raise MmdataError("writing a Rerun recording needs rerun-sdk: pip install 'mmdata[view]'") from exc
    if index in store.damaged:
        raise MmdataError(f"episode {index} is damaged: {store.damaged[index]}; run `mmdata verify {store.url}`")
    row = store.manifest.row(index)
    partial = path.with_name(path.name + ".partial")
    recording = rr.RecordingStream("mmdata", recording_id=f"{store.url}#episode-{index}")
    recording.save(str(partial))
    with tempfile.TemporaryDirectory(prefix="mmdata-rerun-") as scratch:
        for stream in store.schema.streams:
            entity = stream.name
            if isinstance(stream, VideoStream):
                times = store.timestamps_of(row, stream.name)
                if stream.codec in ("h264", "hevc"):
                    video = write_episode_video(store, index, stream.name, Path(scratch) / "camera")
                    asset = rr.AssetVideo(path=str(video.path))
                    recording.log(entity, asset, static=True)
                    stamps = asset.read_frame_timestamps_nanos()
                    recording.send_columns(
                        entity,
                        indexes=[rr.TimeColumn(TIMELINE, duration=times[: len(stamps)])],
                        columns=rr.VideoFrameReference.columns_nanos(stamps),
                    )
                else:
                    frames = Dataset(store).read_episode(index, [stream.name])[stream.name]
                    for time, frame in zip(frames.timestamps, frames.values):
                        recording.set_time(TIMELINE, duration=float(time))
                        recording.log(entity, rr.Image(np.asarray(frame)))
            elif isinstance(stream, LowdimStream):
                span = store.lowdim_span(index, stream.name, -math.inf, math.inf)
                values = np.asarray(span.values, np.float64).reshape(len(span.values), -1)
                recording.send_columns(
                    entity,
                    indexes=[rr.TimeColumn(TIMELINE, duration=span.timestamps)],
                    columns=rr.Scalars.columns(scalars=values),
                )
        recording.log("task", rr.TextDocument(row["task"]), static=True)
        recording.flush()
        recording.disconnect()
    partial.replace(path)
    return path

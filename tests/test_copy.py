"""`mmdata convert --video-codec copy`: a recording's packets cut into segments at key frames, not re-encoded.
The stored frames are the recording's own, bit for bit, with the recording's times, from video files and from
robot logs' `foxglove.CompressedVideo` topics alike; AV1 decodes on the CPU backends that claim it; sources whose
key frames are too sparse, or that hold pictures, are refused by name."""

from __future__ import annotations

import io
import shutil
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

import mmdata
from mmdata.codecs.colour import to_rgb
from mmdata.codecs.video_encode import VideoEncoding
from mmdata.conversion.encode import EncodeOptions
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import SourceError, UnsupportedCodecError
from mmdata.importers import discover_episodes
from mmdata.importers.raw import discover_raw_episodes
from mmdata.store.verification import verify_dataset
from tests import mcap_logs
from tests.conftest import run_cli
from tests.test_decoders import RGB_TOLERANCE

LEROBOT = Path(__file__).parent / "fixtures" / "lerobot_small"
CAMERAS = ("observation.images.cam_high", "observation.images.cam_wrist")


def copy_options(layout: str = "wds", segment_frames: int = 32, **more) -> ConvertOptions:
    video = VideoEncoding(codec="copy", segment_frames=segment_frames, gop=1)
    return ConvertOptions(layout=layout, encode=EncodeOptions(video=video), workers=1, progress=False, **more)


def source_frames(path: Path) -> tuple[np.ndarray, np.ndarray, list[bytes]]:
    """Every frame of a recording (mmdata's RGB conversion), its time in seconds, and its packets' bytes."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [bytes(p) for p in container.demux(stream) if p.size]
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        decoded = [(to_rgb(frame), float(frame.pts * stream.time_base)) for frame in container.decode(stream)]
    return np.stack([f for f, _ in decoded]), np.array([t for _, t in decoded]), packets


def stored_packets(store: mmdata.Store, index: int, camera: str) -> list[bytes]:
    table = store.segment_table(store.manifest.row(index), camera)
    found = []
    for piece in table.pieces:
        with av.open(io.BytesIO(store.segment_bytes(piece))) as container:
            found += [bytes(p) for p in container.demux(container.streams.video[0]) if p.size]
    return found


@pytest.fixture(scope="module", params=["wds", "zarr"])
def lerobot_copy(request, tmp_path_factory) -> Path:
    destination = tmp_path_factory.mktemp("copy") / f"store.{request.param}"
    convert(discover_episodes(str(LEROBOT)), destination, copy_options(request.param), source_root=LEROBOT)
    return destination


@pytest.mark.slow
def test_lerobots_av1_is_stored_packet_for_packet_and_reads_as_its_frames(lerobot_copy):
    store = mmdata.open_dataset(str(lerobot_copy))
    assert verify_dataset(str(lerobot_copy), progress=False).ok
    for camera in CAMERAS:
        spec = store.schema.stream(camera)
        assert (spec.codec, spec.gop, spec.crf, spec.segment_frames) == ("av1", 2, None, 32)
        frames, times, packets = source_frames(LEROBOT / "videos" / camera / "chunk-000" / "file-000.mp4")
        first = 0
        stored = []
        for index in range(len(store)):
            episode = store.read_episode(index, [camera])[camera]
            count = len(episode.values)
            assert np.array_equal(np.asarray(episode.values), frames[first : first + count]), (camera, index)
            np.testing.assert_allclose(episode.timestamps, times[first : first + count] - times[first], atol=1e-9)
            segments = store.manifest.row(index)[f"{camera}/segments"]
            assert all(s["num_frames"] <= 32 and s["num_frames"] % 2 == 0 or s is segments[-1] for s in segments)
            stored += stored_packets(store.store, index, camera)
            first += count
        assert first == len(frames) and stored == packets, "every packet kept as recorded, none added"


@pytest.mark.slow
def test_av1_decodes_on_every_cpu_backend_that_claims_it_and_auto_picks_one(lerobot_copy):
    from mmdata.codecs.decoders.availability import BACKEND_CODECS, backend_available

    reference = np.asarray(mmdata.open_dataset(str(lerobot_copy), decoder="pyav").read_episode(1)[CAMERAS[0]].values)
    for backend, codecs in BACKEND_CODECS.items():
        if backend in ("dali", "nvdec") or not backend_available(backend):
            continue
        if "av1" in codecs:
            frames = mmdata.open_dataset(str(lerobot_copy), decoder=backend).read_episode(1)[CAMERAS[0]].values
            assert np.abs(np.asarray(frames, np.int16) - reference).mean() <= 1.0, backend
        else:
            with pytest.raises(UnsupportedCodecError, match="cannot decode av1 video; use decoder='pyav'"):
                mmdata.open_dataset(str(lerobot_copy), decoder=backend)
    automatic = mmdata.open_dataset(str(lerobot_copy), decoder="auto").read_episode(1)[CAMERAS[0]].values
    assert np.array_equal(np.asarray(automatic), reference)
    batch = next(
        iter(
            mmdata.DataLoader(
                str(lerobot_copy),
                mmdata.Windows(anchor_fps=10, streams={CAMERAS[0]: mmdata.Frames()}),
                batch_size=4,
                num_workers=0,
            )
        )
    )
    assert batch[CAMERAS[0]].shape[-3:] in ((96, 128, 3), (3, 96, 128))


@pytest.fixture(scope="module")
def raw_with_b_frames(raw_dataset, tmp_path_factory) -> Path:
    """The raw dataset with its cameras encoded again by x264 with B-frames and a key frame every 8 frames."""
    root = tmp_path_factory.mktemp("bframes") / "raw"
    shutil.copytree(raw_dataset, root)
    for video in sorted(root.glob("*/*.mp4")):
        with av.open(str(video)) as container:
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
            rate = container.streams.video[0].average_rate
        with av.open(str(video), "w") as container:
            stream = container.add_stream("libx264", rate=Fraction(rate))
            stream.width, stream.height, stream.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
            stream.options = {
                "crf": "18",
                "preset": "fast",
                "x264-params": "keyint=8:min-keyint=8:bframes=2:scenecut=0",
            }
            for pixels in frames:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
            container.mux(stream.encode(None))
    return root


@pytest.mark.slow
def test_h264_with_b_frames_is_cut_at_its_key_frames_and_reads_as_its_frames(raw_with_b_frames, tmp_path):
    report = convert(discover_raw_episodes(raw_with_b_frames), tmp_path / "out", copy_options(segment_frames=16))
    assert report.converted == 3 and verify_dataset(str(tmp_path / "out"), progress=False).ok
    store = mmdata.open_dataset(str(tmp_path / "out"))
    assert store.schema.stream("cam_high").gop == 8
    for index, folder in enumerate(sorted(p for p in raw_with_b_frames.iterdir() if p.is_dir())):
        frames, times, packets = source_frames(folder / "cam_high.mp4")
        episode = store.read_episode(index, ["cam_high"])["cam_high"]
        assert np.array_equal(np.asarray(episode.values), frames)
        np.testing.assert_allclose(episode.timestamps, times, atol=1e-9)
        assert stored_packets(store.store, index, "cam_high") == packets
        assert [s["num_frames"] for s in store.manifest.row(index)["cam_high/segments"]][:-1] == [16] * (
            len(frames) // 16 - (len(frames) % 16 == 0)
        )


def test_key_frames_too_sparse_for_the_segments_are_refused_with_the_interval_found(raw_dataset, tmp_path):
    with pytest.raises(SourceError, match=r"episode_0000.*key frames lie up to \d+ frames apart.*--segment-frames \d+"):
        convert(discover_raw_episodes(raw_dataset), tmp_path / "out", copy_options(segment_frames=32))
    report = convert(discover_raw_episodes(raw_dataset), tmp_path / "whole", copy_options(segment_frames=4096))
    assert report.converted == 3 and verify_dataset(str(tmp_path / "whole"), progress=False).ok


def test_cameras_recorded_as_pictures_are_refused_with_the_way_round(tmp_path):
    images = Path(__file__).parent / "fixtures" / "lerobot_images"
    with pytest.raises(SourceError, match="not read from a video file.*an array of images.*--video-codec h264"):
        convert(discover_episodes(str(images)), tmp_path / "out", copy_options())


def video_log(tmp_path: Path, video_format: str, gop: int = 8, count: int = 24, edit=None) -> Path:
    """A log of one `foxglove.CompressedVideo` topic, its frames stamped ~1/15 s apart with jitter; `edit` may
    change the (packet, frame number) list first."""
    pytest.importorskip("mcap_protobuf")
    packets = mcap_logs.video_packets(video_format, count, gop)
    stamps = [2_000_000_000 + int(n / 15 * 1e9) + (n % 3) * 1_000_000 for n in range(count)]
    return mcap_logs.write_video_log(tmp_path / "video.mcap", video_format, edit(packets) if edit else packets, stamps)


@pytest.mark.parametrize("layout", ["wds", "zarr"])
@pytest.mark.parametrize(
    ("video_format", "codec"), [("h264", "h264"), ("h265", "hevc"), ("vp9", "vp9"), ("av1", "av1")]
)
@pytest.mark.slow
def test_compressed_video_topics_are_copied_and_read_as_the_frames_their_messages_decode_to(
    video_format, codec, layout, tmp_path
):
    (source,) = discover_episodes(video_log(tmp_path, video_format), "mcap")
    camera = source.cameras[0]
    decoded = list(camera.frames(source.name, camera.info(source.name).fps))
    destination = tmp_path / f"store.{layout}"
    convert([source], destination, copy_options(layout, segment_frames=16))
    assert verify_dataset(str(destination), progress=False).ok
    store = mmdata.open_dataset(str(destination))
    spec = store.schema.stream(camera.name)
    assert (spec.codec, spec.gop, spec.crf, spec.fps) == (codec, 8, None, 15)
    assert [s["num_frames"] for s in store.manifest.row(0)[f"{camera.name}/segments"]] == [16, 8]
    episode = store.read_episode(0, [camera.name])[camera.name]
    expected = np.stack([to_rgb(frame) for frame, _ in decoded])
    assert np.array_equal(np.asarray(episode.values), expected)
    np.testing.assert_allclose(episode.timestamps, [t for _, t in decoded], rtol=0, atol=1e-9)
    from mmdata.codecs.decoders.availability import BACKEND_CODECS, backend_available

    for backend, codecs in BACKEND_CODECS.items():  # the MP4 samples made from Annex B read on every CPU backend
        if codec in codecs and backend not in ("dali", "nvdec", "spdl-nvdec") and backend_available(backend):
            frames = mmdata.open_dataset(str(destination), decoder=backend).read_episode(0)[camera.name].values
            assert np.abs(np.asarray(frames, np.int16) - expected).mean() <= RGB_TOLERANCE[backend], backend


def test_compressed_video_whose_key_frames_are_too_sparse_or_missing_at_the_start_is_refused(tmp_path):
    sparse = discover_episodes(video_log(tmp_path, "h264", gop=24), "mcap")
    with pytest.raises(SourceError, match=r"video.mcap.*key frames lie up to 24 frames apart.*--segment-frames 24"):
        convert(sparse, tmp_path / "sparse", copy_options(segment_frames=16))
    late = discover_episodes(video_log(tmp_path, "h264", edit=lambda packets: packets[3:]), "mcap")
    with pytest.raises(SourceError, match="first frame .in the episode. is not a key frame"):
        convert(late, tmp_path / "late", copy_options(segment_frames=16))


def test_compressed_video_messages_holding_two_frames_are_refused(tmp_path):
    def paired(packets):
        return [(packets[0][0] + packets[1][0], 0), *packets[2:]]

    sources = discover_episodes(video_log(tmp_path, "h264", edit=paired), "mcap")
    with pytest.raises(SourceError, match="parser finds 24 frames in its 23 packets, which should hold one frame each"):
        convert(sources, tmp_path / "out", copy_options(segment_frames=16))


def test_image_topics_of_a_log_are_refused_with_the_way_round(tmp_path):
    mcap_logs.write_one_log(tmp_path / "log.mcap")
    sources = discover_episodes(tmp_path / "log.mcap", "mcap")
    with pytest.raises(SourceError, match="carries sensor_msgs/msg/CompressedImage pictures, not video packets"):
        convert(sources, tmp_path / "out", copy_options(skip_bad=False))


@pytest.mark.slow
def test_the_command_line_says_when_copy_is_possible_and_copies(tmp_path):
    shown = run_cli("convert", "--help")
    assert "copy" in shown.stdout and "key frame" in shown.stdout
    done = run_cli("convert", str(LEROBOT), str(tmp_path / "out"), "--video-codec", "copy", "--workers", "1", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "kept as recorded" in done.stdout


def frames_in_presentation_order(video_format: str, packets: list[tuple[bytes, int]]) -> np.ndarray:
    """The frames `packets` (decode order, with their frame numbers) show, decoded and put in presentation order."""
    context = av.CodecContext.create({"h264": "h264", "h265": "hevc"}[video_format], "r")
    shown = []
    for data, number in [*packets, (None, None)]:
        packet = None
        if data is not None:
            packet = av.Packet(data)
            packet.pts = number
        shown += [(frame.pts, to_rgb(frame)) for frame in context.decode(packet)]
    return np.stack([frame for _, frame in sorted(shown, key=lambda item: item[0])])


def b_frame_log(tmp_path: Path, kind: str, video_format: str, stamped_when_sent: bool) -> Path:
    """A log of one CompressedVideo topic of H.264 / H.265 with two B-frames between references, its messages
    logged in decode order (as a recorder receives them) and stamped at their frames' presentation times, or,
    `stamped_when_sent`, in decode order too."""
    packets = mcap_logs.video_packets(video_format, 24, 8, bframes=2)
    assert [n for _, n in packets] != sorted(n for _, n in packets), "the encoder made B-frames"
    sent = [2_000_000_000 + int(position / 15 * 1e9) + 500 for position in range(len(packets))]
    presented = [2_000_000_000 + int(number / 15 * 1e9) for number in range(len(packets))]
    if stamped_when_sent:
        packets = [(data, position) for position, (data, _) in enumerate(packets)]
    if kind == "mcap":
        return mcap_logs.write_video_log(tmp_path / "video.mcap", video_format, packets, presented, log_times=sent)
    from tests import rosbag_logs

    return rosbag_logs.write_video_bag(tmp_path / "bag", video_format, packets, presented, log_times=sent)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mcap", "rosbag"])
@pytest.mark.parametrize(("video_format", "codec"), [("h264", "h264"), ("h265", "hevc")])
def test_b_frames_from_a_log_are_stored_in_the_order_they_are_shown_at_their_stamps(
    kind, video_format, codec, tmp_path
):
    pytest.importorskip("mcap_protobuf" if kind == "mcap" else "rosbags")
    log = b_frame_log(tmp_path, kind, video_format, stamped_when_sent=False)
    expected = frames_in_presentation_order(video_format, mcap_logs.video_packets(video_format, 24, 8, bframes=2))
    for encoding in ("copy", "h264"):
        destination = tmp_path / f"store-{encoding}"
        options = copy_options(segment_frames=16)
        if encoding != "copy":
            options = ConvertOptions(workers=1, progress=False)
        convert(discover_episodes(str(log), kind), destination, options)
        assert verify_dataset(str(destination), progress=False).ok
        store = mmdata.open_dataset(str(destination))
        camera = store.schema.streams[1].name
        episode = store.read_episode(0, [camera])[camera]
        np.testing.assert_allclose(episode.timestamps, np.arange(24) / 15, atol=1e-6)
        difference = np.abs(np.asarray(episode.values, np.int16) - expected).mean(axis=(1, 2, 3))
        if encoding == "copy":
            assert (difference == 0).all(), "each frame the very one shown at its stamp"
            assert store.schema.stream(camera).codec == codec
        else:
            assert (difference < 3).all(), difference


@pytest.mark.parametrize("kind", ["mcap", "rosbag"])
def test_b_frames_stamped_in_the_order_they_were_sent_are_refused_by_copy_and_encoding_alike(kind, tmp_path):
    pytest.importorskip("mcap_protobuf" if kind == "mcap" else "rosbags")
    log = b_frame_log(tmp_path, kind, "h264", stamped_when_sent=True)
    refusal = r"the video has B-frames .* stamp each message with its frame's presentation time"
    with pytest.raises(SourceError, match=refusal):
        convert(discover_episodes(str(log), kind), tmp_path / "copy", copy_options(segment_frames=16))
    with pytest.raises(SourceError, match=refusal):
        convert(discover_episodes(str(log), kind), tmp_path / "encoded", ConvertOptions(workers=1, progress=False))


def segment_stamped_in_decode_order(packets: list[tuple[bytes, int]]) -> bytes:
    """An MP4 segment of H.264 packets with B-frames, stamped pts = dts = decode position: what `--video-codec
    copy` stored before it placed frames at their presentation times."""
    with av.open(io.BytesIO(b"".join(data for data, _ in packets)), format="h264") as source:
        template = source.streams.video[0]
        buffer = io.BytesIO()
        with av.open(buffer, "w", format="mp4") as output:
            stream = output.add_stream_from_template(template, opaque=True)
            stream.time_base = Fraction(1, 15)
            for position, found in enumerate(p for p in source.demux(template) if p.size):
                packet = av.Packet(bytes(found))
                packet.pts = packet.dts = position
                packet.duration, packet.time_base, packet.is_keyframe = 1, Fraction(1, 15), found.is_keyframe
                packet.stream = stream
                output.mux(packet)
    return buffer.getvalue()


def test_a_segment_stamped_out_of_its_frames_order_fails_to_read_and_to_verify(tmp_path):
    from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder, decode_all_frames
    from mmdata.codecs.decoders.requests import ClipRequest
    from mmdata.codecs.packet_index import index_segment
    from mmdata.errors import DecodeError

    data = segment_stamped_in_decode_order(mcap_logs.video_packets("h264", 16, 8, bframes=2))
    size = (mcap_logs.WIDTH, mcap_logs.HEIGHT)
    out_of_order = "come out of the decoder in another order than their stamps say"
    with pytest.raises(DecodeError, match=out_of_order):
        decode_all_frames(data, "h264", size, 16)  # what `mmdata verify` decodes every segment with
    request = ClipRequest(data, tuple(range(16)), "h264", frame_size=size, packets=index_segment(data))
    with pytest.raises(DecodeError, match=out_of_order):
        PyAvDecoder().decode([request])
    ordered = segment_stamped_in_decode_order(mcap_logs.video_packets("h264", 16, 8))
    assert len(decode_all_frames(ordered, "h264", size, 16)) == 16, "without B-frames both orders are one"


def resized_packets(video_format: str) -> list[bytes]:
    """16 frames of 128x96, then 16 of 160x96 starting at a key frame (for H.264 and HEVC a new SPS)."""
    first = mcap_logs.video_packets(video_format, 16, 8)
    second = mcap_logs.video_packets(video_format, 16, 8, size=(160, 96))
    return [data for data, _ in first + second]


@pytest.mark.slow
@pytest.mark.parametrize("video_format", ["h264", "h265", "vp9", "av1"])
def test_copy_refuses_video_whose_frames_change_size_mid_stream_as_encoding_does(video_format, tmp_path):
    pytest.importorskip("mcap_protobuf")
    payloads = resized_packets(video_format)
    stamps = [2_000_000_000 + int(n / 15 * 1e9) for n in range(len(payloads))]
    numbered = [(payload, number) for number, payload in enumerate(payloads)]
    log = mcap_logs.write_video_log(tmp_path / "video.mcap", video_format, numbered, stamps)
    with pytest.raises(SourceError, match=r"message 16|change size at packet 16 .* from 128x96 to 160x96"):
        convert(discover_episodes(str(log), "mcap"), tmp_path / "copy", copy_options(segment_frames=16))
    with pytest.raises(SourceError, match="160x96"):
        convert(discover_episodes(str(log), "mcap"), tmp_path / "encoded", ConvertOptions(workers=1, progress=False))


def raw_camera_file(root: Path, payloads: list[bytes], codec: str, times_ms: list[int]) -> Path:
    """A raw dataset of one episode whose camera is a Matroska file of `payloads` (Annex B) at `times_ms`."""
    folder = root / "episode_000"
    folder.mkdir(parents=True)
    with av.open(io.BytesIO(b"".join(payloads)), format=codec) as source:
        template = source.streams.video[0]
        with av.open(str(folder / "cam_high.mkv"), "w") as output:
            stream = output.add_stream_from_template(template, opaque=True)
            stream.time_base = Fraction(1, 1000)
            for found, stamp in zip((p for p in source.demux(template) if p.size), times_ms):
                packet = av.Packet(bytes(found))
                packet.pts = packet.dts = stamp
                packet.time_base, packet.is_keyframe, packet.stream = Fraction(1, 1000), found.is_keyframe, stream
                output.mux(packet)
    return root


@pytest.mark.parametrize(("video_format", "codec"), [("h264", "h264"), ("h265", "hevc")])
def test_copy_refuses_a_video_file_whose_parameter_sets_change_the_frame_size(video_format, codec, tmp_path):
    payloads = resized_packets(video_format)
    root = raw_camera_file(tmp_path / "raw", payloads, codec, [round(n * 1000 / 15) for n in range(len(payloads))])
    with pytest.raises(SourceError, match="change size at packet 16 of the episode, from 128x96 to 160x96"):
        convert(discover_raw_episodes(root), tmp_path / "copy", copy_options(segment_frames=16))
    with pytest.raises(SourceError, match="160x96"):
        convert(discover_raw_episodes(root), tmp_path / "encoded", ConvertOptions(workers=1, progress=False))


def test_copy_refuses_frames_that_share_a_time_as_encoding_does(tmp_path):
    payloads = [data for data, _ in mcap_logs.video_packets("h264", 16, 8)]
    times = [round(n * 1000 / 15) for n in range(16)]
    times[5] = times[4]
    root = raw_camera_file(tmp_path / "raw", payloads, "h264", times)
    twice = r"frame 5 has timestamp 0\.267000s, not after the previous frame's 0\.267000s"
    with pytest.raises(SourceError, match=twice):
        convert(discover_raw_episodes(root), tmp_path / "copy", copy_options(segment_frames=16))
    with pytest.raises(SourceError, match=twice):
        convert(discover_raw_episodes(root), tmp_path / "encoded", ConvertOptions(workers=1, progress=False))


@pytest.mark.parametrize(
    ("encoder", "options", "pixels"),
    [
        ("libx264", {"profile": "baseline"}, "yuv420p"),
        ("libx264", {"x264-params": "bframes=0"}, "yuv420p"),
        ("libx264", {"x264-params": "bframes=2"}, "yuv420p"),
        ("libx264", {"x264-params": "bframes=3:b-pyramid=normal:cqm=jvt"}, "yuv420p"),
        ("libx264", {"x264-params": "bframes=0:nal-hrd=vbr:vbv-maxrate=1000:vbv-bufsize=2000"}, "yuv420p"),
        ("libx264", {"x264-params": "bframes=2:nal-hrd=vbr:vbv-maxrate=1000:vbv-bufsize=2000"}, "yuv420p"),
        ("libx264", {"x264-params": "bframes=0:sar=16/11:colorprim=bt709:chromaloc=1:crop-rect=2,2,2,2"}, "yuv420p"),
        ("libx264", {"x264-params": "bframes=2:interlaced=1"}, "yuv420p"),
        ("libx264", {"x264-params": "bframes=0"}, "yuv444p"),
        ("libx264", {"x264-params": "bframes=2"}, "yuv444p"),
        ("libx265", {"x265-params": "bframes=0:log-level=none"}, "yuv420p"),
        ("libx265", {"x265-params": "bframes=4:log-level=none"}, "yuv420p"),
        ("libx265", {"x265-params": "bframes=3:temporal-layers=1:log-level=none"}, "yuv420p"),
    ],
)
def test_sequence_parameter_sets_tell_whether_frames_may_be_reordered(encoder, options, pixels):
    """A log's H.264 / HEVC copy is decoded to learn its frame order only where its parameter sets allow
    reordering; they must say so whenever the encoder made B-frames."""
    from mmdata.codecs.parameter_sets import may_reorder, sequence_units

    codec = "h264" if encoder == "libx264" else "hevc"
    context = av.CodecContext.create(encoder, "w")
    context.width, context.height, context.pix_fmt, context.time_base = 64, 48, pixels, Fraction(1, 15)
    context.options = options
    packets = []
    for number in range(13):
        frame = None
        if number < 12:
            picture = np.full((48, 64, 3), number * 10, np.uint8)
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24").reformat(format=pixels)
            frame.pts = number
        packets += [(bytes(packet), packet.pts) for packet in context.encode(frame)]
    reordered = [pts for _, pts in packets] != sorted(pts for _, pts in packets)
    units = list(sequence_units(codec, packets[0][0], 0))
    assert len(units) == 1 and may_reorder(codec, units[0]) == reordered

"""`mmdata convert SRC DST --to wds|zarr`: recorded episodes in, a verified-ready store out."""

from __future__ import annotations

import argparse
import sys

from mmdata.codecs.video_encode import (
    ACCESS_PATTERNS,
    COPY,
    COPY_SEGMENT_FRAMES,
    DEFAULT_CRF,
    DEFAULT_PRESETS,
    PRESETS,
    VIDEO_CODECS,
    VideoEncoding,
    encoding_for_access,
)
from mmdata.conversion.encode import EncodeOptions
from mmdata.conversion.pipeline import ConversionReport, ConvertOptions, convert
from mmdata.errors import OptionError, SourceError
from mmdata.importers import FORMATS, TopicMap, discover_episodes, load_topic_map, shipped_stats
from mmdata.schema import VideoStream
from mmdata.store.filesystem import join, resolve
from mmdata.store.handle import open_store
from mmdata.store.layout import DATASET_FILE
from mmdata.tools.formatting import format_bytes, format_seconds, parse_size
from mmdata.tools.storage import add_storage_options

DEFAULTS = VideoEncoding()


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "convert",
        help="convert recorded episodes into a WebDataset or Zarr store",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Convert recorded episodes (the raw folder layout, a LeRobot v2.1/v3.0 dataset, ALOHA or\n"
            "robomimic HDF5 files, a Diffusion Policy replay-buffer Zarr store, an RLDS / Open\n"
            "X-Embodiment dataset, MCAP robot logs, or ROS 1 / ROS 2 (SQLite) bags) into a store.\n\n"
            "Every camera is re-encoded into closed-GOP segments that decode on their own, audio\n"
            "into FLAC (Opus is kept), low-dim streams are kept bit-exact with their timestamps,\n"
            "and every piece gets a checksum in episodes.parquet. The store appears complete or\n"
            "not at all: dataset.json is written last. An interrupted run continues with --resume."
        ),
    )
    parser.add_argument(
        "source",
        help="the recordings: a raw folder (one sub-folder per episode), a LeRobot dataset, HDF5 files, a"
        " replay-buffer Zarr store, an RLDS builder folder, .mcap logs, or ROS bags (.bag files, ROS 2 bag folders)",
    )
    parser.add_argument(
        "destination",
        help="folder or object-store URL (s3://bucket/store) for the store (created; must be empty, except with"
        " --append, which adds to the store there)",
    )
    parser.add_argument(
        "--to",
        dest="layout",
        choices=["wds", "zarr"],
        default=None,
        help="store layout: WebDataset tar shards or a Zarr v3 store (default wds)",
    )
    parser.add_argument(
        "--from",
        dest="source_format",
        choices=["auto", *FORMATS],
        default="auto",
        help="input format (default: recognised from the source; see docs/importers.md)",
    )
    parser.add_argument(
        "--fps", type=float, help="control rate of HDF5, replay-buffer and RLDS recordings (Hz; RLDS has no timestamps)"
    )
    parser.add_argument(
        "--image-keys",
        help="RLDS: the cameras to keep, by their key under steps/observation (comma-separated; default: every image)",
    )
    parser.add_argument("--task", default="", help="task text for recordings that do not store one")
    parser.add_argument(
        "--topics",
        metavar="MAP.yaml",
        help="MCAP logs and ROS bags: the topic map (YAML or JSON) saying which topics become which cameras,"
        " low-dim streams and task, which time to use and how to split a file into episodes (default: pictures,"
        " JointState and a lone String topic; see docs/importers.md)",
    )
    parser.add_argument(
        "--resample",
        type=float,
        metavar="HZ",
        help="MCAP logs and ROS bags: store low-dim topics resampled to this rate (default: each message at its"
        " own time)",
    )
    video = parser.add_argument_group("video")
    video.add_argument(
        "--video-codec",
        choices=[*sorted(VIDEO_CODECS), COPY],
        default=None,
        help=f"codec of stored segments (default {DEFAULTS.codec}). 'copy' keeps the recording's H.264, HEVC, AV1"
        " or VP9 packets as they are: nothing is decoded or encoded, so conversion runs at the speed of the disk"
        " (LeRobot's AV1 on 2 cores: ~24x the frames/s of encoding) and no generation of quality is lost. It is"
        " possible for video files (raw MP4s, LeRobot videos) and foxglove.CompressedVideo topics of MCAP logs and"
        " ROS bags, whose key frames lie at most --segment-frames apart (LeRobot writes one every 2 frames;"
        " segments are cut at key frames, up to --segment-frames long); other sources are refused with the"
        " interval found, and cameras of pictures (images, HDF5/RLDS arrays) with the way round. It trades the"
        " decode tuning of --access, --gop and --crf for the recording's own codec, key-frame interval and size;"
        " AV1 decodes on the CPU through PyAV (dav1d)",
    )
    video.add_argument(
        "--segment-frames",
        type=int,
        default=None,
        help=f"frames per stored segment (default {DEFAULTS.segment_frames}; with --video-codec copy, at most this"
        f" many, cut at key frames: default {COPY_SEGMENT_FRAMES})",
    )
    video.add_argument(
        "--access",
        choices=sorted(ACCESS_PATTERNS),
        default=None,
        help="how the store will be read, which sets the key-frame interval and decode tuning:"
        " 'both' (default: a key frame every 8 frames, tuned for fast decoding), 'clips' (the same"
        " untuned: ~17%% smaller, decoding twice as slow on the CPU) or 'windows' (every frame a key"
        " frame, tuned; ~2.6x the bytes of 'both'). With the loader's default order and frame cache"
        " each frame is decoded about once, so policy windows read from a 'both' store within ~10%%"
        " of a 'windows' store (LeRobot's 100 episodes, 2 workers: 1,670 against 1,856 samples/s,"
        " 7.1x and 7.9x LeRobot's own loader) at 0.96x LeRobot's size against 2.6x. See"
        " docs/loading.md, 'Decoding each frame once'",
    )
    video.add_argument(
        "--gop",
        type=int,
        default=None,
        help="key-frame interval inside a segment (default: from --access; 8 for clips and both, 1 for windows)."
        " Short intervals serve policy windows (a few frames per sample: fewer frames decoded before the one"
        " wanted), long ones CPU clip reading and storage. Measured on 224x224, 30 fps in the former"
        " 'locality' order: every frame a key frame (--access windows) served LeRobot-style windows at 478"
        " samples/s against 256 with 8, for ~2.5-3x the bytes (in today's default order, within ~10%%: see"
        " --access); 32 decodes 16-frame clips ~7%% faster than 8 on one CPU core at ~83%% of its size, but is"
        " slower on the GPU and for windows (CPU-only clip training: --gop 32). See docs/architecture.md,"
        " 'Access patterns'",
    )
    video.add_argument(
        "--crf",
        type=float,
        default=None,
        help="constant rate factor, lower is better quality and more bytes (default: "
        + ", ".join(f"{crf:g} for {codec}" for codec, crf in DEFAULT_CRF.items())
        + "; x264 and x265 take fractions, vp9 whole numbers)",
    )
    video.add_argument(
        "--preset",
        default=None,
        choices=PRESETS,
        metavar="PRESET",
        help="encoder speed preset for h264/hevc, ultrafast to placebo (default: "
        + ", ".join(f"{preset} for {codec}" for codec, preset in DEFAULT_PRESETS.items())
        + "; slower presets store fewer bytes at the same quality, at the encoder's cost)",
    )
    parser.add_argument("--shard-size", default=None, help="target size of a WebDataset shard (default 1GB)")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="episodes encoded in parallel (default: all cores; with --engine ray, twice the cluster's CPUs)",
    )
    parser.add_argument(
        "--duration-tolerance",
        type=float,
        default=0.1,
        help="seconds a low-dim stream may differ from the video's length (default 0.1)",
    )
    parser.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip episodes that cannot be converted and report them, instead of stopping",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="add SRC's episodes to the store at DST (new shards or new rows only; nothing it holds is rewritten)."
        " They must have the store's streams, and are encoded as its own were (its layout, codec and segment"
        " length: the --to and video options are not taken). The store's manifest, dataset.json and stats.json"
        " are replaced last, so a reader sees the store before or after, whole; an interrupted append continues"
        " with --append --resume (until then the store is as it was). `mmdata inspect` lists the appends."
        " See docs/append-export.md",
    )
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true", help="continue an interrupted conversion into DST")
    existing.add_argument("--overwrite", action="store_true", help="replace whatever DST holds")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--staging",
        help=(
            "local folder a store for object storage (DST an s3:// or other fsspec URL) is made in before it is"
            " uploaded, dataset.json last (default: ~/.cache/mmdata/staging/<hash of DST>, or $MMDATA_STAGING);"
            " kept until the upload finishes, so --resume continues either"
        ),
    )
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help=(
            "local: a process pool on this machine (default); ray: episodes encoded and shards written by Ray tasks"
            " across a cluster, straight into DST (a folder every node shares, or an object-store URL); the store"
            " is the same either way (needs `pip install 'mmdata[ray]'` on every node; see docs/object-storage.md)"
        ),
    )
    cluster.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help=(
            "Ray cluster to run on with --engine ray, e.g. 10.0.0.1:6379 or ray://head:10001 (default: $RAY_ADDRESS,"
            " else a cluster `ray start` made on this machine, else a new one on this machine)"
        ),
    )
    add_storage_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    destination = args.destination.removeprefix("file://")
    image_keys = args.image_keys.split(",") if args.image_keys else None
    sources = discover_episodes(args.source, args.source_format, args.fps, args.task, image_keys, _topic_map(args))
    if args.append:
        _check_append_options(args, destination)
    video = encoding_for_access(
        args.access or "both",
        codec=args.video_codec or DEFAULTS.codec,
        segment_frames=_segment_frames(args),
        gop=args.gop,
        crf=args.crf,
        preset=args.preset,
    )
    options = ConvertOptions(
        layout=args.layout or "wds",
        encode=EncodeOptions(video=video, duration_tolerance=args.duration_tolerance),
        shard_bytes=parse_size(args.shard_size or "1GB"),
        workers=args.workers,
        skip_bad=args.skip_bad,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=not args.quiet,
        staging=args.staging,
        engine=args.engine,
        ray_address=args.ray_address,
        append=args.append,
    )
    try:
        source_stats = shipped_stats(args.source, args.source_format)
        report = convert(sources, destination, options, source_root=args.source, source_stats=source_stats)
    except SourceError:
        print(
            "mmdata convert: finished shards are kept; fix the episode and run the same command with"
            " --resume (add --skip-bad to leave it out)",
            file=sys.stderr,
        )
        raise
    print_report(report, copy=options.encode.video.codec == COPY or args.append)
    return 0


def _segment_frames(args: argparse.Namespace) -> int:
    if args.segment_frames is not None:
        return args.segment_frames
    return COPY_SEGMENT_FRAMES if args.video_codec == COPY else DEFAULTS.segment_frames


def _check_append_options(args: argparse.Namespace, destination: str) -> None:
    """An append stores episodes as the store's own are: refuse options that would say otherwise."""
    given = [
        flag
        for flag, value in (
            ("--video-codec", args.video_codec),
            ("--segment-frames", args.segment_frames),
            ("--access", args.access),
            ("--gop", args.gop),
            ("--crf", args.crf),
            ("--preset", args.preset),
            ("--shard-size", args.shard_size),
        )
        if value is not None
    ]
    if given:
        raise OptionError(
            f"--append encodes the new episodes as the store's own were (dataset.json records how); drop"
            f" {', '.join(given)}"
        )
    fs, root = resolve(destination)
    if args.layout is not None and fs.exists(join(root, DATASET_FILE)):
        layout = open_store(destination).schema.layout
        if layout != args.layout:
            raise OptionError(
                f"'{destination}' is a {layout} store: an append keeps its layout; drop --to {args.layout}"
            )


def copied_summary(report: ConversionReport) -> list[str]:
    """Lines on the cameras a `--video-codec copy` kept as recorded (no crf): codec, segment lengths, key-frame
    interval."""
    if not report.converted:
        return []
    store = open_store(report.destination)
    lines = []
    for stream in store.schema.streams:
        if not isinstance(stream, VideoStream) or stream.crf is not None:
            continue
        lengths = [s["num_frames"] for row in store.table.column(f"{stream.name}/segments").to_pylist() for s in row]
        lines.append(
            f"  {stream.name}: kept as recorded ({stream.codec}, not re-encoded): {len(lengths)} segments of"
            f" {min(lengths)}-{max(lengths)} frames (mean {sum(lengths) / len(lengths):.1f}), key frames at most"
            f" {stream.gop} frames apart"
        )
    return lines


def _topic_map(args: argparse.Namespace) -> TopicMap | None:
    """The MCAP topic map of --topics, with --resample applied (alone: the default streams, resampled);
    None for the default map."""
    if args.topics is None:
        return TopicMap().with_resample(args.resample) if args.resample is not None else None
    return load_topic_map(args.topics).with_resample(args.resample)


def print_report(report: ConversionReport, copy: bool = False) -> None:
    rate = report.converted / report.seconds if report.seconds else 0.0
    resumed = f", resumed at episode {report.resumed_at}" if report.resumed_at else ""
    done = f"converted {report.converted} episodes into"
    if report.first_episode:
        done = f"appended {report.converted} episodes (numbers {report.first_episode}-"
        done += f"{report.first_episode + report.converted - 1}) to"
    print(
        f"{done} {report.destination} ({report.layout}) in {format_seconds(report.seconds)}"
        f" ({rate:.2f} episodes/s{resumed})"
    )
    if report.input_bytes:
        print(
            f"  size: {format_bytes(report.input_bytes)} of recordings (video, audio, data files; not metadata)"
            f" -> store {format_bytes(report.output_bytes)} (every file); ratio"
            f" {report.output_bytes / report.input_bytes:.2f}"
        )
    for line in copied_summary(report) if copy else []:
        print(line)
    if report.skipped:
        print(f"  skipped {len(report.skipped)} episodes:")
        for entry in report.skipped:
            print(f"    {entry['error']}")
    if report.stats_problem:
        print(f"  warning: {report.stats_problem}")
    else:
        print(f"  statistics:    {report.destination}/{report.stats_file} (for Values(normalize=...))")
    print(f"  check it with: mmdata verify {report.destination}")
    print(f"  look inside:   mmdata inspect {report.destination}")

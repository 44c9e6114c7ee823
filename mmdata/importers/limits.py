"""What one episode of an input may make an importer read into memory, checked before reading.

Importers read recordings written by other tools, some damaged, some hostile: a file's metadata
is checked against these bounds before the data it declares is allocated, so that a few bytes
declaring gigabytes are an error naming the file, never a memory blow-up.
"""

MAX_LOWDIM_BYTES = 1 << 30  # one low-dim stream of one episode
MAX_IMAGE_BLOCK_BYTES = 256 << 20  # images taken from an array at a time
MAX_ARRAY_CHUNK_BYTES = 512 << 20  # one compressed chunk of an HDF5 / Zarr array, decompressed
MAX_AUDIO_CHANNELS = 8  # what FLAC stores
MAX_AUDIO_RATE = 768_000
MAX_AUDIO_SECONDS_WITHOUT_VIDEO = 4 * 3600.0
MAX_FRAME_SIDE = 8192
MAX_METADATA_BYTES = 16 << 20  # a meta.json, info.json or episodes.jsonl


def frame_size_problem(width: int, height: int) -> str | None:
    """Why frames of `width` x `height` cannot be stored, or None."""
    if 0 < width <= MAX_FRAME_SIDE and 0 < height <= MAX_FRAME_SIDE:
        return None
    return f"frames of {width}x{height}; sides from 1 to {MAX_FRAME_SIDE} pixels are stored"

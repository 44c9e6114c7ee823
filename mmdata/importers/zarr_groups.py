"""Opening a source's Zarr group (v2 or v3, folder or zip) read-only, with image codecs registered when
installed, and a clear error when an array needs a codec this installation lacks. Zarr is imported
only when a group is opened."""

from __future__ import annotations

import functools
import warnings

from mmdata.errors import MissingDependencyError


@functools.lru_cache(maxsize=8)
def open_replay_group(path: str):
    """The root group of a replay buffer (Zarr v2 or v3, folder or zip), read-only."""
    import zarr

    _register_imagecodecs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if path.endswith(".zip"):
            from zarr.storage import ZipStore

            return zarr.open_group(ZipStore(path, mode="r"), mode="r")
        return zarr.open_group(path, mode="r")


def _register_imagecodecs() -> None:
    """Let numcodecs decode imagecodecs-compressed images when the package is installed."""
    try:
        from imagecodecs.numcodecs import register_codecs
    except ImportError:
        return
    register_codecs()


def missing_codec(error: Exception) -> MissingDependencyError | None:
    """A clear error when an array's codec is one the `imagecodecs` package provides and it is missing."""
    text = str(error)
    if "imagecodecs" in text.lower() or "jpegxl" in text.lower() or "jpeg2k" in text.lower():
        return MissingDependencyError(
            f"compressed with a codec this installation lacks ({text.strip()}); JPEG-XL and JPEG 2000"
            " images are decoded by the 'imagecodecs' package"
        )
    return None

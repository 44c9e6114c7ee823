"""mmdata: multimodal episode stores and a loader that keeps training GPUs fed."""

__version__ = "0.1.0"

from mmdata.dataset import Dataset, EpisodeData, StreamData, open_dataset  # noqa: E402
from mmdata.errors import (  # noqa: E402
    DecodeError,
    DestinationError,
    IntegrityError,
    MmdataError,
    SourceError,
    StoreError,
)
from mmdata.schema import AudioStream, DatasetSchema, LowdimStream, TextStream, VideoStream  # noqa: E402

__all__ = [
    "AudioStream",
    "Dataset",
    "DatasetSchema",
    "DecodeError",
    "DestinationError",
    "EpisodeData",
    "IntegrityError",
    "LowdimStream",
    "MmdataError",
    "SourceError",
    "StoreError",
    "StreamData",
    "TextStream",
    "VideoStream",
    "open_dataset",
]

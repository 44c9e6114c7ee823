"""mmdata: multimodal episode stores and a loader that keeps training GPUs fed."""

__version__ = "0.1.0"

from mmdata.bench.steps import StepTimer  # noqa: E402
from mmdata.dataset import Dataset, EpisodeData, StreamData, open_dataset  # noqa: E402
from mmdata.errors import (  # noqa: E402
    AlignmentError,
    DecodeError,
    DestinationError,
    IntegrityError,
    MissingDependencyError,
    MmdataError,
    SampleError,
    SourceError,
    StoreError,
    UnsupportedCodecError,
)
from mmdata.loading import (  # noqa: E402
    Audio,
    DataLoader,
    Episodes,
    Frames,
    Sequences,
    SpecError,
    Values,
    Windows,
)
from mmdata.schema import AudioStream, DatasetSchema, LowdimStream, TextStream, VideoStream  # noqa: E402
from mmdata.sharding.epoch_plan import ResumeError  # noqa: E402

__all__ = [
    "AlignmentError",
    "Audio",
    "AudioStream",
    "DataLoader",
    "Episodes",
    "Frames",
    "ResumeError",
    "SampleError",
    "Sequences",
    "SpecError",
    "Values",
    "Windows",
    "Dataset",
    "DatasetSchema",
    "DecodeError",
    "DestinationError",
    "EpisodeData",
    "IntegrityError",
    "LowdimStream",
    "MissingDependencyError",
    "MmdataError",
    "SourceError",
    "StepTimer",
    "StoreError",
    "StreamData",
    "TextStream",
    "UnsupportedCodecError",
    "VideoStream",
    "open_dataset",
]

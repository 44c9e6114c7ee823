"""mmdata: multimodal episode stores and a loader that keeps training GPUs fed.

Names are imported when first used (PEP 562), so that `import mmdata`, the CLI and
`mmdata.open_dataset` do not load torch: only the loader and the bench tools need it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "AlignmentError": "mmdata.errors",
    "DecodeError": "mmdata.errors",
    "DestinationError": "mmdata.errors",
    "IntegrityError": "mmdata.errors",
    "MissingDependencyError": "mmdata.errors",
    "MmdataError": "mmdata.errors",
    "ReadError": "mmdata.errors",
    "ReadTimeoutError": "mmdata.errors",
    "SampleError": "mmdata.errors",
    "SourceError": "mmdata.errors",
    "StoreError": "mmdata.errors",
    "UnsupportedCodecError": "mmdata.errors",
    "AudioStream": "mmdata.schema",
    "DatasetSchema": "mmdata.schema",
    "LowdimStream": "mmdata.schema",
    "TextStream": "mmdata.schema",
    "VideoStream": "mmdata.schema",
    "Dataset": "mmdata.dataset",
    "EpisodeData": "mmdata.dataset",
    "StreamData": "mmdata.dataset",
    "open_dataset": "mmdata.dataset",
    "ReadPolicy": "mmdata.sharding.filesystem",
    "Audio": "mmdata.loading.specs",
    "Frames": "mmdata.loading.specs",
    "Resize": "mmdata.loading.specs",
    "Mixture": "mmdata.loading.mixture",
    "Source": "mmdata.loading.mixture",
    "Sequences": "mmdata.loading.specs",
    "SpecError": "mmdata.loading.specs",
    "Values": "mmdata.loading.specs",
    "Windows": "mmdata.loading.specs",
    "Episodes": "mmdata.loading.episodes",
    "DataLoader": "mmdata.loading.dataloader",
    "ResumeError": "mmdata.sharding.epoch_plan",
    "StepTimer": "mmdata.bench.steps",
}
__all__ = [
    "AlignmentError",
    "Audio",
    "AudioStream",
    "DataLoader",
    "Dataset",
    "DatasetSchema",
    "DecodeError",
    "DestinationError",
    "EpisodeData",
    "Episodes",
    "Frames",
    "IntegrityError",
    "LowdimStream",
    "MissingDependencyError",
    "Mixture",
    "MmdataError",
    "ReadError",
    "ReadPolicy",
    "ReadTimeoutError",
    "Resize",
    "ResumeError",
    "SampleError",
    "Sequences",
    "Source",
    "SourceError",
    "SpecError",
    "StepTimer",
    "StoreError",
    "StreamData",
    "TextStream",
    "UnsupportedCodecError",
    "Values",
    "VideoStream",
    "Windows",
    "open_dataset",
]

if TYPE_CHECKING:
    from mmdata.bench.steps import StepTimer
    from mmdata.dataset import Dataset, EpisodeData, StreamData, open_dataset
    from mmdata.errors import (
        AlignmentError,
        DecodeError,
        DestinationError,
        IntegrityError,
        MissingDependencyError,
        MmdataError,
        ReadError,
        ReadTimeoutError,
        SampleError,
        SourceError,
        StoreError,
        UnsupportedCodecError,
    )
    from mmdata.loading.dataloader import DataLoader
    from mmdata.loading.episodes import Episodes
    from mmdata.loading.mixture import Mixture, Source
    from mmdata.loading.specs import Audio, Frames, Resize, Sequences, SpecError, Values, Windows
    from mmdata.schema import AudioStream, DatasetSchema, LowdimStream, TextStream, VideoStream
    from mmdata.sharding.epoch_plan import ResumeError
    from mmdata.sharding.filesystem import ReadPolicy


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mmdata' has no attribute '{name}'")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])

"""mmdata: multimodal episode stores and a loader that keeps training GPUs fed.

Names are imported when first used (PEP 562), so that `import mmdata`, the CLI and
`mmdata.open_dataset` do not load torch: only the loader and the bench tools need it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mmdata.version import __version__ as __version__

_EXPORTS = {
    "AlignmentError": "mmdata.errors",
    "ConcurrentWriteError": "mmdata.errors",
    "CopyError": "mmdata.errors",
    "DecodeError": "mmdata.errors",
    "DestinationError": "mmdata.errors",
    "EditError": "mmdata.errors",
    "ExportError": "mmdata.errors",
    "IntegrityError": "mmdata.errors",
    "MessageError": "mmdata.errors",
    "MissingDependencyError": "mmdata.errors",
    "MmdataError": "mmdata.errors",
    "NpyError": "mmdata.errors",
    "OptionError": "mmdata.errors",
    "ReadError": "mmdata.errors",
    "ReadTimeoutError": "mmdata.errors",
    "SampleError": "mmdata.errors",
    "SourceError": "mmdata.errors",
    "StorageBusyError": "mmdata.errors",
    "StoreError": "mmdata.errors",
    "TFRecordError": "mmdata.errors",
    "UnsupportedCodecError": "mmdata.errors",
    "AudioStream": "mmdata.schema",
    "DatasetSchema": "mmdata.schema",
    "LowdimStream": "mmdata.schema",
    "TextStream": "mmdata.schema",
    "VideoStream": "mmdata.schema",
    "Dataset": "mmdata.store.dataset",
    "EpisodeData": "mmdata.store.handle",
    "Store": "mmdata.store.handle",
    "open_store": "mmdata.store.handle",
    "StreamData": "mmdata.store.handle",
    "open_dataset": "mmdata.store.dataset",
    "ReadPolicy": "mmdata.store.filesystem",
    "Audio": "mmdata.planning.specs",
    "Frames": "mmdata.planning.specs",
    "Resize": "mmdata.planning.specs",
    "Mixture": "mmdata.planning.mixture",
    "Source": "mmdata.planning.mixture",
    "Sequences": "mmdata.planning.specs",
    "SpecError": "mmdata.errors",
    "Values": "mmdata.planning.specs",
    "Windows": "mmdata.planning.specs",
    "Episodes": "mmdata.planning.episodes",
    "DataLoader": "mmdata.loading.dataloader",
    "Batching": "mmdata.loading.loader_options",
    "Reading": "mmdata.loading.loader_options",
    "Runtime": "mmdata.loading.loader_options",
    "Shuffling": "mmdata.loading.loader_options",
    "ResumeError": "mmdata.errors",
    "StepTimer": "mmdata.measure.steps",
}
__all__ = [
    "AlignmentError",
    "Audio",
    "AudioStream",
    "Batching",
    "ConcurrentWriteError",
    "CopyError",
    "DataLoader",
    "Dataset",
    "DatasetSchema",
    "DecodeError",
    "DestinationError",
    "EpisodeData",
    "Episodes",
    "EditError",
    "ExportError",
    "Frames",
    "IntegrityError",
    "LowdimStream",
    "MessageError",
    "MissingDependencyError",
    "Mixture",
    "MmdataError",
    "NpyError",
    "open_dataset",
    "open_store",
    "OptionError",
    "ReadError",
    "Reading",
    "ReadPolicy",
    "ReadTimeoutError",
    "Resize",
    "ResumeError",
    "Runtime",
    "SampleError",
    "Sequences",
    "Shuffling",
    "Source",
    "SourceError",
    "SpecError",
    "StepTimer",
    "StorageBusyError",
    "Store",
    "StoreError",
    "StreamData",
    "TextStream",
    "TFRecordError",
    "UnsupportedCodecError",
    "Values",
    "VideoStream",
    "Windows",
]

if TYPE_CHECKING:
    from mmdata.errors import (
        AlignmentError,
        ConcurrentWriteError,
        CopyError,
        DecodeError,
        DestinationError,
        EditError,
        ExportError,
        IntegrityError,
        MessageError,
        MissingDependencyError,
        MmdataError,
        NpyError,
        OptionError,
        ReadError,
        ReadTimeoutError,
        ResumeError,
        SampleError,
        SourceError,
        SpecError,
        StorageBusyError,
        StoreError,
        TFRecordError,
        UnsupportedCodecError,
    )
    from mmdata.loading.dataloader import DataLoader
    from mmdata.loading.loader_options import Batching, Reading, Runtime, Shuffling
    from mmdata.measure.steps import StepTimer
    from mmdata.planning.episodes import Episodes
    from mmdata.planning.mixture import Mixture, Source
    from mmdata.planning.specs import Audio, Frames, Resize, Sequences, Values, Windows
    from mmdata.schema import AudioStream, DatasetSchema, LowdimStream, TextStream, VideoStream
    from mmdata.store.dataset import Dataset, open_dataset
    from mmdata.store.filesystem import ReadPolicy
    from mmdata.store.handle import EpisodeData, Store, StreamData, open_store


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mmdata' has no attribute '{name}'")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])

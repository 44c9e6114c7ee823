"""Audio features computed with torchaudio when the `audio` extra is installed."""

from __future__ import annotations

import numpy as np

from mmdata.codecs.audio import AudioClip, as_float
from mmdata.errors import MissingDependencyError


def mel_spectrogram(clip: AudioClip, n_mels: int = 80, n_fft: int = 400, hop_length: int = 160):
    """Log-free mel power spectrogram `[C, n_mels, frames]` (torch float32) of a clip.

    Needs torchaudio (`pip install 'mmdata[audio]'`); without it the error says so instead of
    a bare ImportError deep in a worker.
    """
    try:
        import torch
        import torchaudio
    except ImportError as exc:
        raise MissingDependencyError(
            "mel spectrograms need torchaudio, which is not installed: pip install 'mmdata[audio]'"
            " (or ask for raw audio samples and compute features in the model)"
        ) from exc
    transform = torchaudio.transforms.MelSpectrogram(
        sample_rate=clip.sample_rate, n_fft=n_fft, hop_length=hop_length, n_mels=n_mels
    )
    waveform = torch.from_numpy(np.ascontiguousarray(as_float(clip.samples).T))
    return transform(waveform)

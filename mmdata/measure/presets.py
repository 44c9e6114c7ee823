"""Ready-made sampling specs for a store, so `mmdata bench DATASET` needs no code.

- "policy": ACT / Diffusion-Policy / pi0 windows at 10 Hz anchors: 2 frames of every camera
  (t - 0.1 s, t), 2 values of every low-dim stream, a 50-step chunk of future values for streams
  whose name contains "action", and the last second of audio.
- "clips": 16-frame clips at stride 2 of every camera (video world models, video encoders).
- "sequences": whole episodes in chunks of `max_seconds`, every stream at 10 Hz (audio whole).
"""

from __future__ import annotations

from collections.abc import Sequence

from mmdata.errors import SpecError
from mmdata.planning.specs import Audio, Frames, Sequences, Spec, Values, Windows
from mmdata.schema import DatasetSchema, LowdimStream, VideoStream

PRESETS = ("policy", "clips", "sequences")
TOKENS_PER_FRAME = {"policy": 256, "clips": 256, "sequences": 64}
TOKENS_PER_AUDIO_SECOND = 50


def preset_spec(
    schema: DatasetSchema,
    name: str,
    streams: Sequence[str] | None = None,
    anchor_fps: float | None = None,
    max_seconds: float = 8.0,
    action_chunk: int = 50,
) -> Spec:
    """The preset `name` over `streams` of the store (default: every non-text stream)."""
    if name not in PRESETS:
        raise SpecError(f"unknown spec preset '{name}'; choose one of {', '.join(PRESETS)}")
    chosen = [schema.stream(s) for s in streams] if streams else [s for s in schema.streams if s.kind != "text"]
    specs: dict = {}
    for stream in chosen:
        if isinstance(stream, VideoStream):
            if name == "clips":
                specs[stream.name] = Frames(offsets=[-(15 - i) * 2 / stream.fps for i in range(16)])
            else:
                specs[stream.name] = Frames(offsets=[-0.1, 0.0]) if name == "policy" else Frames()
        elif isinstance(stream, LowdimStream):
            if name == "sequences":
                specs[stream.name] = Values()
            elif name == "policy" and "action" in stream.name and stream.rate:
                specs[stream.name] = Values(offsets=[i / stream.rate for i in range(action_chunk)])
            else:
                specs[stream.name] = Values(offsets=[-0.1, 0.0] if name == "policy" else [0.0])
        elif stream.kind == "audio" and name != "clips":
            specs[stream.name] = Audio(window=(-1.0, 0.0))
    if name == "sequences":
        return Sequences(fps=anchor_fps or 10.0, max_seconds=max_seconds, streams=specs)
    return Windows(anchor_fps=anchor_fps or (10.0 if name == "policy" else 5.0), streams=specs)


def default_tokens_per(spec: Spec, preset: str) -> dict[str, float]:
    """Tokens per frame (256 for windows, a ViT's 16x16 patches; 64 for sequences), 1 per value, 50 per audio second."""
    tokens: dict[str, float] = {}
    for name, stream in spec.streams.items():
        if isinstance(stream, Frames):
            tokens[name] = TOKENS_PER_FRAME.get(preset, 256)
        elif isinstance(stream, Audio):
            tokens[name] = TOKENS_PER_AUDIO_SECOND
        else:
            tokens[name] = 1
    return tokens

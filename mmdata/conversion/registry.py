"""The dataset's streams, learnt from the first episode and checked against every later one."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from mmdata.errors import SourceError
from mmdata.schema import LowdimStream, Stream, VideoStream, stream_from_dict, stream_to_dict


class EpisodeStreams(Protocol):
    """What the registry needs of an episode (an EncodedEpisode, or a summary of one)."""

    @property
    def source(self) -> str: ...

    @property
    def streams(self) -> list[Stream]: ...


class StreamRegistry:
    """Holds one spec per stream; an episode that disagrees is rejected with the reason."""

    def __init__(self, saved: list[dict[str, Any]] | None = None):
        self._streams: dict[str, Stream] = {}
        for entry in saved or []:
            stream = stream_from_dict(entry)
            self._streams[stream.name] = stream

    @property
    def streams(self) -> list[Stream]:
        return list(self._streams.values())

    def to_json(self) -> list[dict[str, Any]]:
        return [stream_to_dict(s) for s in self._streams.values()]

    def check_and_add(self, episode: EpisodeStreams) -> None:
        """Raise SourceError if the episode's streams differ from earlier episodes'; else record them."""
        incoming = {s.name: s for s in episode.streams}
        if not self._streams:
            self._streams = dict(incoming)
            return
        missing = sorted(set(self._streams) - set(incoming))
        extra = sorted(set(incoming) - set(self._streams))
        if missing or extra:
            raise SourceError(
                episode.source,
                None,
                f"streams differ from earlier episodes (missing: {missing or 'none'}, new: {extra or 'none'})",
                "give every episode the same cameras, audio and low-dim streams, or pass --skip-bad",
            )
        merged = {}
        for name, known in self._streams.items():
            merged[name] = self._merge(episode.source, known, incoming[name])
        self._streams = merged

    @staticmethod
    def _merge(source: str, known: Stream, new: Stream) -> Stream:
        if isinstance(known, LowdimStream) and isinstance(new, LowdimStream) and known.rate != new.rate:
            new = dataclasses.replace(new, rate=None)
            known = dataclasses.replace(known, rate=None)
        copied = isinstance(known, VideoStream) and isinstance(new, VideoStream) and known.crf is None is new.crf
        if copied and isinstance(known, VideoStream) and isinstance(new, VideoStream) and known.gop != new.gop:
            # copied videos: the store states the widest key-frame interval
            new = dataclasses.replace(new, gop=max(known.gop, new.gop))
            known = dataclasses.replace(known, gop=new.gop)
        if known == new:
            return known
        differences = [
            f"{field.name} {getattr(new, field.name)!r} (earlier episodes: {getattr(known, field.name)!r})"
            for field in dataclasses.fields(known)
            if getattr(known, field.name) != getattr(new, field.name)
        ]
        raise SourceError(
            source,
            None,
            f"stream '{known.name}' differs from earlier episodes: " + "; ".join(differences),
            "re-record or re-export it to match, or pass --skip-bad",
        )

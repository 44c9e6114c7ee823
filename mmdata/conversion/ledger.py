"""The converter's account of a conversion, kept in source order whatever engine encodes the episodes:
the streams seen so far, each kept episode's number in the store, the skipped episodes, the merged
low-dim moments, and the checkpoint a resumed run starts from."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from mmdata.checks import as_int
from mmdata.conversion.registry import EpisodeStreams, StreamRegistry
from mmdata.errors import DestinationError, SourceError
from mmdata.moments import Moments
from mmdata.schema import Stream, stream_to_dict
from mmdata.store.layout import start_again


class EncodedOutline(EpisodeStreams, Protocol):
    """What the ledger needs of an encoded episode (the episode itself, or a summary of it)."""

    @property
    def moments(self) -> dict[str, Moments]: ...


class ConversionLedger:
    """Accepts each episode's outcome in source order; numbers kept episodes, records skipped ones."""

    def __init__(self, checkpoint: Any, sources: int, root: str | Path, streams: list[Stream] | None = None):
        """Restore the account from a saved checkpoint (None: a new conversion, whose episodes must have
        `streams` when given: an append's), checking each field: the resume state is data someone else may
        have written."""
        known = [stream_to_dict(s) for s in streams or []]
        checkpoint = checkpoint or {"next_position": 0, "next_index": 0, "skipped": [], "streams": known}
        try:
            if not isinstance(checkpoint, dict):
                raise ValueError("it is not an object")
            self.next_position = as_int(checkpoint.get("next_position"), "next_position", 0, sources)
            self.next_index = as_int(checkpoint.get("next_index"), "next_index", 0, self.next_position)
            skipped = checkpoint.get("skipped")
            if not isinstance(skipped, list) or not all(isinstance(s, dict) for s in skipped):
                raise ValueError("'skipped' is not a list of objects")
            saved_streams = checkpoint.get("streams")
            if not isinstance(saved_streams, list):
                raise ValueError("'streams' is not a list")
            saved_moments = checkpoint.get("moments", {})
            if not isinstance(saved_moments, dict):
                raise ValueError("'moments' is not an object")
            self.moments = {str(name): Moments.from_json(figures) for name, figures in saved_moments.items()}
        except ValueError as exc:
            raise DestinationError(
                f"'{root}': the saved conversion state cannot be resumed from ({exc}); {start_again(root)}"
            ) from exc
        self.resumed_at = self.next_position
        self.skipped: list[dict[str, str]] = list(skipped)
        self.registry = StreamRegistry(saved_streams)

    def accept(self, position: int, name: str, outcome: EncodedOutline | SourceError, skip_bad: bool) -> int | None:
        """Account for the episode at `position`: its number in the store, or None when it is skipped.
        A bad episode (its own error, or streams that disagree with earlier ones) raises unless `skip_bad`."""
        if not isinstance(outcome, SourceError):
            try:
                self.registry.check_and_add(outcome)
            except SourceError as problem:
                outcome = problem
        self.next_position = position + 1
        if isinstance(outcome, SourceError):
            if not skip_bad:
                raise outcome
            self.skipped.append({"episode": name, "error": str(outcome)})
            return None
        for stream, figures in outcome.moments.items():
            self.moments[stream] = self.moments.get(stream, Moments()).merge(figures)
        self.next_index += 1
        return self.next_index - 1

    def checkpoint(self) -> dict[str, Any]:
        """The state a resumed conversion continues from, after the last accepted episode."""
        return {
            "next_position": self.next_position,
            "next_index": self.next_index,
            "skipped": list(self.skipped),
            "streams": self.registry.to_json(),
            "moments": {name: figures.to_json() for name, figures in self.moments.items()},
        }

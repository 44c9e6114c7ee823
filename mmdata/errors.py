"""Exception types raised by mmdata; every message names the file or episode and the fix."""

from __future__ import annotations

from typing import Any


class MmdataError(Exception):
    """Base class of every error mmdata raises on purpose."""


class OptionError(MmdataError, ValueError):
    """A public option was given a value of the wrong type, or out of its range; the message names it."""


class SourceError(MmdataError):
    """An input episode cannot be converted: a file is missing, unreadable, inconsistent or hostile."""

    def __init__(self, episode: str, file: str | None, problem: str, fix: str | None = None, scope: str = "episode"):
        self.episode = episode
        self.file = file
        self.problem = problem
        self.fix = fix
        self.scope = scope
        where = f"{scope} '{episode}'" + (f", file '{file}'" if file else "")
        message = f"{where}: {problem}"
        if fix:
            message += f" ({fix})"
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.episode, self.file, self.problem, self.fix, self.scope))

    @classmethod
    def for_source(cls, source: str, file: str | None, problem: str, fix: str | None = None) -> SourceError:
        """A problem with the input as a whole (its folder, format or metadata), not with one episode."""
        return cls(source, file, problem, fix, scope="source")


class DestinationError(MmdataError):
    """The conversion destination cannot be written as asked (not empty, or resume mismatch)."""


class EditError(MmdataError):
    """A store edit (`mmdata edit`) that cannot be made as asked; the store is left as it was."""


class ConcurrentWriteError(MmdataError):
    """Another writer changed a store (published a version of it, or holds it now) while this one was writing it:
    nothing of this writer's change was published, and running it again applies it to the store as it is now."""


class ExportError(MmdataError):
    """A store (or the episodes asked for) cannot be written in the format asked; the message says why."""


class StoreError(MmdataError):
    """A path is not a readable mmdata store, or its manifest disagrees with its contents."""


class IntegrityError(StoreError):
    """A stored piece fails its checksum, is missing, or does not decode to what the manifest says."""


class ReadError(StoreError):
    """A stored object could not be read: a permanent error, or transient ones past the retry budget."""


class ReadTimeoutError(ReadError, TimeoutError):
    """A read did not complete within its timeout (a stalled remote, a file that never returns data)."""


class StorageBusyError(StoreError, OSError):
    """Object storage answered a read with throttling or a server error: transient, so the read policy tries it
    again (raised past the retry budget as a ReadError)."""


class DecodeError(MmdataError):
    """Encoded bytes could not be decoded by the chosen backend; `where` names the segment when known (a
    `SegmentRef`)."""

    where: Any = None


class CopyError(DecodeError):
    """A recording whose packets cannot become a store's segments as they are (`--video-codec copy`)."""


class UnsupportedCodecError(MmdataError):
    """The chosen decoding backend cannot decode a stream's codec; raised when the reader is built."""


class AlignmentError(MmdataError):
    """A requested time has no stored value within the tolerance the caller set."""


class MissingDependencyError(MmdataError):
    """An optional feature needs a package that is not installed; the message names the extra to install."""


class SampleError(MmdataError):
    """A training sample could not be read or decoded; names the shard, the episode and the stream."""


class SpecError(OptionError):
    """A sampling spec asks for something the store cannot give; the message says what to change."""


class ResumeError(MmdataError):
    """A saved loader state does not fit this loader (other data, spec or settings, or a corrupt state)."""


class NpyError(MmdataError, ValueError):
    """`.npy` bytes whose header is malformed or disagrees with their length or with what was expected."""


class TFRecordError(MmdataError):
    """A TFRecord file or an Example in it that cannot be read; the message names the file and the record."""


class MessageError(MmdataError, ValueError):
    """A message does not hold what its topic is read for; the message says what it holds."""

"""What a conversion is asked to do (`ConvertOptions`) and what it reports (`ConversionReport`),
shared by both engines: the local process pool (`pipeline`) and Ray (`ray_engine`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from mmdata.conversion.completion import creation_info
from mmdata.conversion.encode import EncodeOptions
from mmdata.errors import OptionError
from mmdata.importers.episode import EpisodeSource
from mmdata.schema import Layout
from mmdata.store.wds_writer import DEFAULT_SHARD_BYTES

Engine = Literal["local", "ray"]


@dataclass(frozen=True)
class ConvertOptions:
    """Everything that shapes the output; `skip_bad`, `workers`, `progress`, `staging` (the local
    folder a conversion into object storage is made in), `engine` ("local": a process pool on this
    machine; "ray": a Ray cluster, see `mmdata.conversion.ray_engine`) and `ray_address` do not.
    `append` adds the episodes to the complete store at the destination (see `mmdata.conversion.append`):
    they are then encoded as its own were, into its layout."""

    layout: Layout = "wds"
    encode: EncodeOptions = EncodeOptions()
    shard_bytes: int = DEFAULT_SHARD_BYTES
    workers: int | None = None
    skip_bad: bool = False
    resume: bool = False
    overwrite: bool = False
    progress: bool = True
    staging: str | None = None
    engine: Engine = "local"
    ray_address: str | None = None
    append: bool = False

    def __post_init__(self) -> None:
        if self.append and self.overwrite:
            raise OptionError("--append adds to the store at the destination; --overwrite replaces it: give one")
        if self.append and self.engine != "local":
            raise OptionError("--append runs on the local engine; drop --engine ray")

    def fingerprint(self, sources: list[EpisodeSource]) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "encode": asdict(self.encode),
            "shard_bytes": self.shard_bytes if self.layout == "wds" else None,
            "episodes": [s.name for s in sources],
        }

    def creation_info(self, sources: list[EpisodeSource], skipped: list) -> dict[str, Any]:
        return creation_info(self.encode.video, self.layout, self.shard_bytes, sources, skipped)


@dataclass
class ConversionReport:
    destination: str
    layout: str
    converted: int
    skipped: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    input_bytes: int = 0
    output_bytes: int = 0
    resumed_at: int = 0
    stats_problem: str | None = None
    first_episode: int = 0  # an append's: the number its first new episode got
    stats_file: str = "stats.json"  # (an append's version has its own)

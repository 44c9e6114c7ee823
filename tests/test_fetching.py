"""The fetch stage (`loading.fetching.Fetcher`): what each source's piece reader is asked to bring, and when.
The pieces come from the plans alone (the samples' manifest rows, the frame plans' segments), go to the source
they belong to, and what is fetched ahead for the next micro-batch is merged per source into one request."""

from __future__ import annotations

from types import SimpleNamespace

import mmdata
from mmdata.loading.fetching import Fetcher
from mmdata.planning.samples import SampleRef


class _Pieces:
    """A source's piece reader that records what it is asked for."""

    def __init__(self, fetches_ahead: bool = False):
        self.fetches_ahead, self.calls, self.fetch_seconds = fetches_ahead, [], None

    def prefetch(self, pieces):
        self.calls.append(("now", list(pieces)))

    def prefetch_ahead(self, by_read):
        self.calls.append(("ahead", [list(pieces) for pieces in by_read]))

    def forget(self):
        self.calls.append(("forget", []))


def _source(fetches_ahead: bool = False):
    store = SimpleNamespace(
        pieces=_Pieces(fetches_ahead), row_pieces=lambda episode, names: [f"row {episode} {name}" for name in names]
    )
    return SimpleNamespace(store=store)


def _sample(episode: int, source: int) -> SampleRef:
    return SampleRef(episode, episode, f"e{episode}", "s", 0.0, 0.0, 0, 1, source)


def _names(sample, only=None):
    """The stored streams of every sample: a camera and a low-dim stream (`only=Frames`: the camera)."""
    return ["cam"] if only is mmdata.Frames else ["cam", "state"]


def test_rows_name_each_samples_pieces_under_its_own_source():
    fetcher = Fetcher([_source(), _source()], stored_names=_names)
    wanted = fetcher.rows([_sample(3, 0), _sample(5, 1), _sample(4, 0)])
    assert wanted == {0: ["row 3 cam", "row 3 state", "row 4 cam", "row 4 state"], 1: ["row 5 cam", "row 5 state"]}
    assert fetcher.rows([_sample(3, 0)], mmdata.Frames) == {0: ["row 3 cam"]}, "what aligning frames reads"


def test_pieces_fetched_now_from_several_lists_go_to_their_sources_in_one_request_each():
    sources = [_source(fetches_ahead=True), _source(fetches_ahead=True)]
    fetcher = Fetcher(sources, stored_names=_names)
    fetcher.now(fetcher.rows([_sample(1, 0)]), fetcher.rows([_sample(2, 0), _sample(3, 1)], mmdata.Frames))
    assert sources[0].store.pieces.calls == [("now", ["row 1 cam", "row 1 state", "row 2 cam"])]
    assert sources[1].store.pieces.calls == [("now", ["row 3 cam"])]


def test_fetching_ahead_merges_each_later_reads_rows_and_segments_per_source_and_forget_reaches_every_source():
    sources = [_source(fetches_ahead=True), _source()]
    fetcher = Fetcher(sources, stored_names=lambda sample, only=None: ["cam"])
    assert fetcher.fetches_ahead, "one source in object storage is enough"
    segments = {0: ["segment a"], 1: ["segment b"]}
    fetcher.ahead([[fetcher.rows([_sample(1, 0)]), segments], [fetcher.rows([_sample(3, 0)])]])
    fetcher.now({1: ["row 2 cam"]})
    fetcher.forget()
    assert sources[0].store.pieces.calls == [("ahead", [["row 1 cam", "segment a"], ["row 3 cam"]]), ("forget", [])]
    assert sources[1].store.pieces.calls == [("ahead", [["segment b"], []]), ("now", ["row 2 cam"]), ("forget", [])]


def test_a_local_store_fetches_nothing_ahead(stores):
    store = mmdata.open_store(stores["wds"])
    assert not Fetcher([SimpleNamespace(store=store)], stored_names=lambda sample, only=None: []).fetches_ahead

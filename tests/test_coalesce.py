"""Byte ranges fetched together: every piece lies in exactly the one request it is assigned to, pieces of
one shard close together share a request, and no request grows past its limit for merging's sake."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdata.store.manifest import Piece
from mmdata.store.piece_readers import coalesce

pieces = st.lists(
    st.builds(
        Piece,
        st.sampled_from(["shards/a.tar", "shards/b.tar"]),
        st.integers(0, 10_000),
        st.integers(0, 3_000),
        st.just(""),
    ),
    max_size=40,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(pieces, st.integers(0, 2_000), st.integers(1, 8_000))
def test_every_piece_lies_in_the_request_it_is_assigned_to(wanted, gap, limit):
    ranges = coalesce(wanted, gap, limit)
    members = [piece for span in ranges for piece in span.members]
    assert sorted(members, key=repr) == sorted(set(wanted), key=repr)
    for span in ranges:
        assert span.members and all(span.holds(piece) for piece in span.members)
        alone = len(span.members) == 1 or all(
            p.offset == span.start and p.size == span.end - span.start for p in span.members
        )
        assert alone or span.end - span.start <= limit or any(p.size > limit for p in span.members)


def test_close_pieces_of_one_shard_share_a_request_and_far_ones_do_not():
    near = [Piece("s.tar", 0, 100, ""), Piece("s.tar", 150, 100, ""), Piece("s.tar", 260, 10, "")]
    far = Piece("s.tar", 10_000, 10, "")
    other = Piece("t.tar", 100, 10, "")
    ranges = coalesce([*near, far, other], gap=64, limit=1_000)
    assert [(r.path, r.start, r.end, len(r.members)) for r in ranges] == [
        ("s.tar", 0, 270, 3),
        ("s.tar", 10_000, 10_010, 1),
        ("t.tar", 100, 110, 1),
    ]

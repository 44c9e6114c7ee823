"""The disk cache of pieces from object storage touches only what it wrote: never a user's files beside it,
never through a link planted in a shared folder; and a cache it cannot lock or write only makes reads slower."""

from __future__ import annotations

import os

from mmdata.store.manifest import Piece
from mmdata.store.piece_cache import LOCK_FILE, SUBFOLDER, PieceCache


def _pieces(count: int, size: int = 1000) -> list[Piece]:
    return [Piece("shards/shard-000000.tar", size * i, size, f"{i:016x}") for i in range(count)]


def test_trimming_never_removes_files_the_cache_did_not_write(tmp_path):
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    for number in range(20):
        (experiments / f"run-{number}.csv").write_bytes(b"x" * 2000)
        os.utime(experiments / f"run-{number}.csv", (1, 1))  # older than any entry: first to go if counted
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / ("0" * 32)).write_bytes(b"y" * 2000)  # named like an entry, but outside the cache's folder
    cache = PieceCache(tmp_path, max_bytes=10_000, namespace="s3://bucket/store")
    for number, piece in enumerate(_pieces(40)):
        cache.put(piece, bytes([number]) * 1000)
    assert sorted(p.name for p in experiments.iterdir()) == sorted(f"run-{n}.csv" for n in range(20))
    assert (tmp_path / "ab" / ("0" * 32)).read_bytes() == b"y" * 2000
    assert cache.size() <= 10_000 * 1.05, "the cache still trims its own entries"
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent not in (experiments, tmp_path / "ab")]
    assert written and all(p.is_relative_to(tmp_path / SUBFOLDER) for p in written), "only its own folder"


def test_a_link_planted_in_a_shared_cache_folder_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / ("f" * 32)).write_bytes(b"precious" * 500)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"s" * 1000)
    folder = tmp_path / "cache"
    pieces = _pieces(40)
    planted = PieceCache(folder, max_bytes=10_000, namespace="s3://bucket/store")
    first_path = planted._path(pieces[0], create=True)
    first_path.symlink_to(secret)  # an entry that is a link to another file
    shard = planted.folder / "ff"
    shard.symlink_to(victim, target_is_directory=True)  # a shard folder that is a link elsewhere
    assert planted.get(pieces[0]) is None, "a linked entry is never read"
    for number, piece in enumerate(pieces[1:], start=1):
        planted.put(piece, bytes([number]) * 1000)
    assert (victim / ("f" * 32)).read_bytes() == b"precious" * 500, "trimming did not follow the link"
    assert secret.read_bytes() == b"s" * 1000
    assert os.listdir(victim) == ["f" * 32], "nothing was written there"


def test_a_cache_whose_lock_file_belongs_to_another_user_still_serves_reads(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    cache = PieceCache(folder, max_bytes=3_000, namespace="s3://bucket/store")
    cache.folder.mkdir(parents=True)
    lock = cache.folder / LOCK_FILE
    lock.write_bytes(b"")
    real_open = os.open

    def as_another_users_file(path, flags, *args):
        if str(path) == str(lock) and flags & (os.O_RDWR | os.O_WRONLY):
            raise PermissionError(13, "Permission denied", str(path))  # what a 0644 file of another user gives
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", as_another_users_file)
    pieces = _pieces(10)
    for number, piece in enumerate(pieces):
        cache.put(piece, bytes([number]) * 1000)
        assert cache.get(piece) == bytes([number]) * 1000
    assert cache.size() <= 3_000 * 1.05, "trimmed under a read-only lock"


def test_a_cache_folder_that_cannot_be_locked_or_written_only_makes_reads_slower(tmp_path, monkeypatch):
    cache = PieceCache(tmp_path / "cache", max_bytes=3_000, namespace="s3://bucket/store")
    real_open = os.open

    def nothing_opens(path, flags, *args):
        if str(path).startswith(str(cache.folder)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", nothing_opens)
    for number, piece in enumerate(_pieces(10)):
        cache.put(piece, bytes([number]) * 1000)
        assert cache.get(piece) is None

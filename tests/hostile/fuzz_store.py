"""Fuzz a small store: mutate `dataset.json`, `episodes.parquet` or one shard (bytes, or values in
their structure), then open, verify, read and load it. Each step must work or raise an mmdata
error; any other exception fails the run (hypothesis prints the smallest mutation that does).

Run in a subprocess by `test_fuzz_store.py`, so that a crash (a signal) or a hang (the test's
timeout) is caught as well: `python -m tests.hostile.fuzz_store STORE --examples N`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import mmdata
from mmdata.store.verification import verify_dataset

SPEC = mmdata.Windows(
    anchor_fps=4,
    streams={
        "cam_high": mmdata.Frames(offsets=[-0.1, 0.0]),
        "state": mmdata.Values(offsets=[0.0, 0.1]),
        "audio": mmdata.Audio(window=(-0.25, 0.0)),
    },
)
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
)
EDIT_KINDS = st.sampled_from(["flip", "zero", "cut", "insert"])
BYTE_EDITS = st.lists(
    st.tuples(st.floats(0, 1, exclude_max=True), EDIT_KINDS, st.binary(max_size=8)), min_size=1, max_size=6
)


def mutate_bytes(path: Path, edits) -> None:
    data = bytearray(path.read_bytes())
    for where, kind, payload in edits:
        if not data:
            break
        at = int(where * len(data))
        if kind == "flip":
            data[at] ^= 0xFF
        elif kind == "zero":
            data[at : at + 64] = bytes(len(data[at : at + 64]))
        elif kind == "cut":
            del data[at:]
        else:
            data[at:at] = payload
    path.write_bytes(bytes(data))


def mutate_schema(path: Path, choice: float, value) -> None:
    document = json.loads(path.read_text())
    places = [(document, key) for key in document]
    for stream in document["streams"]:
        places += [(stream, key) for key in stream]
    container, key = places[int(choice * len(places))]
    container[key] = value
    path.write_text(json.dumps(document))


def mutate_manifest(path: Path, row: float, column: float, value) -> None:
    table = pq.read_table(path)
    rows = table.to_pylist()
    names = table.column_names
    name = names[int(column * len(names))]
    target = rows[int(row * len(rows))]
    piece = target[name]
    if isinstance(piece, dict):
        piece[sorted(piece)[int(row * len(piece))]] = value
    elif isinstance(piece, list) and piece:
        item = piece[int(row * len(piece))]
        item[sorted(item)[int(column * len(item))]] = value
    else:
        target[name] = value
    try:
        rebuilt = pa.Table.from_pylist(rows, schema=table.schema)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return  # a value the column's type cannot hold: Parquet itself would refuse to store it
    pq.write_table(rebuilt, path)


def exercise(store: Path) -> None:
    """Open, verify, read and load `store`; only mmdata errors may come out."""
    try:
        dataset = mmdata.open_dataset(store)
    except mmdata.MmdataError:
        return
    with contextlib.suppress(mmdata.MmdataError):
        verify_dataset(str(store), progress=False)
    for episode in range(len(dataset)):
        with contextlib.suppress(mmdata.MmdataError):
            dataset.read_episode(episode)
            dataset.audio_between(episode, "audio", 0.0, 0.5, sample_rate=8000)
    with contextlib.suppress(mmdata.MmdataError):
        for _ in mmdata.DataLoader(store, SPEC, batch_size=3, on_error="skip", seed=1, num_workers=0):
            pass


def shard_of(store: Path) -> Path:
    if (store / "shards").is_dir():
        return sorted((store / "shards").iterdir())[0]
    return store / "video" / "cam_high" / "c" / "0"


def fuzzing(examples: int, random_seed: int | None):
    """Hypothesis settings of every fuzzer here: `examples` of them, CI's fixed sequence unless a seed is
    given, no example database, no deadline (a subprocess timeout bounds the run)."""
    options = settings(
        max_examples=examples,
        derandomize=random_seed is None,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    return lambda test: seed(random_seed or 0)(options(test))


def run(pristine: Path, examples: int, random_seed: int | None = None) -> None:
    work = Path(tempfile.mkdtemp(prefix="mmdata-fuzz-"))

    def fresh() -> Path:
        target = work / "store"
        shutil.rmtree(target, ignore_errors=True)
        return Path(shutil.copytree(pristine, target))

    @fuzzing(examples, random_seed)
    @given(
        target=st.sampled_from(["dataset.json", "episodes.parquet", "shard", "schema-value", "manifest-value"]),
        edits=BYTE_EDITS,
        where=st.tuples(st.floats(0, 1, exclude_max=True), st.floats(0, 1, exclude_max=True)),
        value=ODD_VALUES,
    )
    def fuzz(target, edits, where, value):
        store = fresh()
        if target == "shard":
            mutate_bytes(shard_of(store), edits)
        elif target == "schema-value":
            mutate_schema(store / "dataset.json", where[0], value)
        elif target == "manifest-value":
            mutate_manifest(store / "episodes.parquet", where[0], where[1], value)
        else:
            mutate_bytes(store / target, edits)
        exercise(store)

    try:
        fuzz()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("store", type=Path)
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--seed", type=int, help="explore other examples than CI's fixed sequence")
    args = parser.parse_args()
    run(args.store, args.examples, args.seed)
    print("fuzzed", args.examples, "examples without an unexpected exception", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

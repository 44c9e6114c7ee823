"""File names shared by every store layout, and what to do with an interrupted run's state that cannot be used."""

from pathlib import Path

DATASET_FILE = "dataset.json"
MANIFEST_FILE = "episodes.parquet"
PARTIAL_DIR = ".mmdata-partial"
SHARDS_DIR = "shards"
APPEND_FILE = "append.json"  # in PARTIAL_DIR while an append is under way
WRITER_FILE = ".mmdata-writer.json"  # who writes the store now (`store.hold`); no reader reads it
CONVERT_AGAIN = "convert again with --overwrite, which deletes what the interrupted conversion wrote"


def give_append_up(partial: str | Path) -> str:
    """How to give an interrupted append up: delete its partial folder `partial` (the store stays as it was)."""
    return (
        f"delete '{partial}' to give the interrupted append up (the store stays as it was before it), then append again"
    )


def start_again(root: str | Path) -> str:
    """What to do when an interrupted run's saved state under the local folder `root` cannot be used, saying what
    it deletes: an append is given up by deleting its partial folder (the store stays as it was); `--overwrite`,
    which would replace the whole store, is suggested only for a conversion."""
    root = Path(root)
    if (root / DATASET_FILE).exists() or (root / PARTIAL_DIR / APPEND_FILE).exists():
        return give_append_up(root / PARTIAL_DIR)
    return CONVERT_AGAIN

"""File names shared by every store layout."""

DATASET_FILE = "dataset.json"
MANIFEST_FILE = "episodes.parquet"
PARTIAL_DIR = ".mmdata-partial"
SHARDS_DIR = "shards"

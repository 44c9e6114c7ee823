"""The store: its layout on disk or object storage, the manifest and its checks, the readers and
writers of pieces (WebDataset shards, Zarr arrays), the caches, statistics and verification.

`Store` (see `handle`) is an open store without a decoder; `Dataset` (see `dataset`) reads decoded
values from one.
"""

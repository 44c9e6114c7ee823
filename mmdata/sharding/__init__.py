"""Stores: WebDataset and Zarr writers and readers, the manifest, and byte-range access."""

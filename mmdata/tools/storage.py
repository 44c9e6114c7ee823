"""`--storage-options`: fsspec options for object stores (endpoint, credentials), per protocol.

`--storage-options '{"s3": {"endpoint_url": "http://10.0.0.5:9000", "key": "...", "secret": "..."}}'`
sets them for every `s3://` URL the command touches, as fsspec's configuration does; the usual
environment variables (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `FSSPEC_S3_ENDPOINT_URL`, ...) work
as well and need no option.
"""

from __future__ import annotations

import argparse
import json

import fsspec.config

from mmdata.errors import MmdataError


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-options",
        metavar="JSON",
        help=(
            "fsspec options per protocol for object-store URLs, e.g."
            ' \'{"s3": {"endpoint_url": "http://host:9000"}}\' (credentials also come from the usual'
            " environment variables and config files)"
        ),
    )


def apply_storage_options(text: str | None) -> None:
    """Merge the options into fsspec's configuration for this process (and the workers it forks)."""
    if not text:
        return
    try:
        options = json.loads(text)
    except ValueError as exc:
        raise MmdataError(f"--storage-options is not JSON: {exc}") from exc
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise MmdataError(
            '--storage-options takes an object of options per protocol, like {"s3": {"endpoint_url": "..."}}'
        )
    for protocol, settings in options.items():
        fsspec.config.conf[protocol] = {**fsspec.config.conf.get(protocol, {}), **settings}

"""`python -m mmdata.codecs.decoders.link_spdl`: let SPDL load PyAV's FFmpeg and the driver's NVDEC library
(see `spdl_libraries`)."""

from __future__ import annotations

import sys

from mmdata.codecs.decoders.spdl_libraries import link_spdl_libraries, spdl_problem
from mmdata.errors import MissingDependencyError


def main() -> int:
    try:
        links = link_spdl_libraries()
    except MissingDependencyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for link in links:
        print(f"{link} -> {link.resolve()}")
    problem = spdl_problem()
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    print("SPDL loads PyAV's FFmpeg: decoder='spdl' can run")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A camera whose reading crashes the process (as a decoder bug would), for conversion tests.

Kept in its own module so that spawned conversion workers can import it by name.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from mmdata.importers.episode import CameraSource


@dataclass(frozen=True)
class CrashingCamera(CameraSource):
    def info(self, episode: str):
        ctypes.string_at(0)  # a segmentation fault, like a crash inside a native decoder
        raise AssertionError("unreachable")

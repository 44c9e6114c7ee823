"""Worker processes that end with the process that started them.

A worker whose parent dies (`kill -9`, `os._exit`, an out-of-memory kill) would otherwise run on: a
conversion worker keeps encoding, and a loader worker blocks for ever writing a batch into a pipe no one
reads. `exit_with_parent` runs in a worker as it starts and ends it within a second of its parent's death.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
CHECK_SECONDS = 1.0


def exit_with_parent(parent: int, kill_with_parent_thread: bool = False) -> None:
    """In a worker of process `parent`: exit at once if it is gone, and within CHECK_SECONDS when it goes.

    `kill_with_parent_thread` also asks Linux to kill the worker with its parent (PR_SET_PDEATHSIG). The
    kernel ties that to the *thread* that started the worker, so only pools started from a thread that
    lives as long as they do (the converter's main thread) may ask for it.
    """
    if kill_with_parent_thread and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="mmdata-parent-watch", daemon=True).start()

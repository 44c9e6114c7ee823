"""The conversion's worker processes: spawned, tied to this process's life, and started again when one dies.

A spawned worker imports what its jobs need (the episode encoding and the source's importer), not the
running program: the `mmdata` command's entry point imports nothing (`mmdata.tools.entry`). The store's
statistics are computed afterwards in this process, which has their code loaded already; a worker would
load it (and numba's kernels) first, which takes longer than the figures themselves."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from mmdata.lifetime import exit_with_parent


class WorkerPool:
    """`workers` spawned processes that exit when this one dies, even by SIGKILL (see `mmdata.lifetime`); none
    for one worker, where the work runs in this process (`executor` is then None)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None

    @property
    def executor(self) -> ProcessPoolExecutor | None:
        if self.workers <= 1:
            return None
        if self._executor is None:
            self._executor = spawned_pool(self.workers)
        return self._executor

    def restart(self) -> None:
        """Drop a pool a dead worker broke (its jobs cancelled); the next use starts a new one."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def close(self, wait: bool = True) -> None:
        """Stop the workers: with `wait`, return once they have exited."""
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, failure_type, *_) -> None:
        # After a conversion that ended well the idle workers exit on their own (a process that decoded video
        # takes ~0.3 s to shut its libraries down), while the store is already complete; after a failure
        # they are waited for, so that nothing outlives the error.
        self.close(wait=failure_type is not None)


def spawned_pool(workers: int) -> ProcessPoolExecutor:
    """`workers` spawned processes that exit when this process dies (see `mmdata.lifetime`)."""
    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=exit_with_parent,
        initargs=(os.getpid(), True),
    )

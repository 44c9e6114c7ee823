"""A training process that dies leaves no loader worker behind: workers notice their parent's death
(as conversion workers do) instead of blocking for ever on a pipe no one reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.hostile.test_conversion_safety import alive, children_of

TRAINING = """
import os, sys, time
import mmdata
streams = {"cam_high": mmdata.Frames(offsets=[-0.1, 0.0]), "cam_wrist": mmdata.Frames(offsets=[0.0])}
spec = mmdata.Windows(anchor_fps=10, streams={**streams, "state": mmdata.Values()})
# workers send encoded segments (bytes in the pipe, not tensors in shared memory): the pipe fills
loader = mmdata.DataLoader(sys.argv[1], spec, batch_size=64, num_workers=2, decode_in=sys.argv[3])
batches = iter(loader)
next(batches)
print("READY", flush=True)
time.sleep(3)  # the workers fill the pipe meanwhile, and block writing into it
if sys.argv[2] == "exit":
    os._exit(0)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("death", "decode_in"), [("exit", "main"), ("kill", "main"), ("exit", "workers")])
def test_loader_workers_end_when_the_training_process_dies(stores, death, decode_in):
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(TRAINING), str(stores["wds"]), death, decode_in],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert process.stdout.readline().strip() == "READY"
    workers = children_of(process.pid)
    assert len(workers) >= 2, "the loader started its workers"
    if death == "kill":
        os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "loader workers outlived the training process"

"""A batch shared between two decoders by their measured rates (NVDEC and the host's cores on a GPU machine),
proved here with two CPU backends standing in: the split, the order of the outputs and their exactness."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import mmdata
from mmdata.codecs.decoders import HybridDecoder, RateSplit
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder
from tests.conftest import camera_batches


class SlowPyAv(PyAvDecoder):
    """PyAV that also waits `delay` seconds per frame delivered: a backend of a known, lower rate."""

    name = "slow-pyav"

    def __init__(self, delay: float):
        super().__init__()
        self.delay = delay

    def _decode_batch(self, requests, on_error):
        time.sleep(self.delay * sum(len(r.frames) for r in requests))
        return super()._decode_batch(requests, on_error)


class PreparingPyAv(PyAvDecoder):
    """PyAV split into host work (`prepare`: which requests to decode, and the thread that chose them) and
    decoding (`decode_prepared`), as DALI's decoder is split: for the hybrid's worker-side path. `prepare`
    sets `started` once it runs."""

    name = "preparing-pyav"
    prepares = True

    def __init__(self):
        super().__init__()
        self.started = threading.Event()

    def prepare(self, requests):
        self.started.set()
        return [id(r) for r in requests], threading.current_thread().name

    def decode_prepared(self, requests, prepared, on_error="raise"):
        ids, thread = prepared
        assert ids == [id(r) for r in requests], "prepared for these requests"
        self.prepared_in = thread
        return self.decode(requests, on_error)


def _requests(store) -> list:
    dataset = mmdata.open_dataset(str(store))
    requests = []
    for episode in range(3):
        for start in (0.0, 0.5, 1.0):
            requests += dataset.plan_frames(episode, "cam_high", start + np.arange(4) / 30).requests
    return requests


def test_rate_split_gives_each_side_its_share_of_the_frames_by_measured_rate():
    split = RateSplit(first_share=0.5, smoothing=0.5)
    assert split.cut([4] * 8) == 4, "before both sides are measured, the initial share"
    split.observe(0, 300, 1.0)
    assert split.first_share == 0.5, "one side measured is not yet a comparison"
    split.observe(1, 100, 1.0)
    assert split.first_share == pytest.approx(0.75) and split.cut([4] * 8) == 6
    split.observe(0, 100, 1.0)  # the first side slowed down: halfway to its new rate
    assert split.rates[0] == pytest.approx(200) and split.first_share == pytest.approx(2 / 3)
    assert split.cut([10, 1, 1]) == 1 and split.cut([]) == 0
    split.observe(1, 0, 0.0)
    assert split.rates[1] == pytest.approx(100), "an empty batch teaches nothing"
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        RateSplit(first_share=1.0)
    helped = RateSplit(helpers=2)
    helped.observe(0, 300, 1.0)
    helped.observe(1, 100, 1.0)
    assert helped.first_share == pytest.approx(0.6), "two workers decoding at once count the second side twice"


@pytest.mark.slow
def test_hybrid_outputs_equal_one_backends_in_request_order_and_the_slower_side_gets_less(stores):
    requests = _requests(stores["wds"])
    expected = PyAvDecoder().decode(requests)
    hybrid = HybridDecoder(PyAvDecoder(), SlowPyAv(delay=0.02))
    for _ in range(4):
        outputs = hybrid.decode(requests)
        assert len(outputs) == len(requests)
        assert all(np.array_equal(got, want) for got, want in zip(outputs, expected)), "same frames, same order"
    assert hybrid.split.rates[0] > hybrid.split.rates[1] and hybrid.split.first_share > 0.6
    first, second = hybrid.first.stats.requests, hybrid.second.stats.requests
    assert first > second > 0 and hybrid.stats.requests == first + second == 4 * len(requests)
    assert "of the frames to the first" in hybrid.describe()


def test_a_worker_prepares_the_head_while_it_decodes_the_tail_and_the_outputs_stay_exact(stores):
    class WaitingForTheHead(PyAvDecoder):
        def _decode_batch(self, requests, on_error):
            assert first.started.wait(10), "the head is prepared while the tail decodes, not after"
            return super()._decode_batch(requests, on_error)

    requests = _requests(stores["wds"])
    expected = PyAvDecoder().decode(requests)
    first = PreparingPyAv()
    hybrid = HybridDecoder(first, WaitingForTheHead())
    prepared = hybrid.prepare(requests)
    assert 0 < prepared[0] < len(requests), "both sides had a share"
    outputs = hybrid.decode_prepared(requests, prepared)
    assert hybrid.first.prepared_in.startswith("mmdata-hybrid"), "prepared on the helper thread"
    assert all(np.array_equal(got, want) for got, want in zip(outputs, expected)), "same frames, same order"


def test_the_dataloader_with_a_hybrid_decoder_delivers_the_batches_of_a_single_backend(stores):
    single = camera_batches(stores["wds"], "pyav", seed=2)
    hybrid = camera_batches(stores["wds"], HybridDecoder(PyAvDecoder(), PyAvDecoder()), seed=2)
    assert len(single) == len(hybrid)
    for (ids, frames), (hybrid_ids, hybrid_frames) in zip(single, hybrid):
        assert torch.equal(ids, hybrid_ids) and torch.equal(frames, hybrid_frames)


def test_decoder_hybrid_needs_a_gpu_and_says_so_where_there_is_none():
    from mmdata.codecs.decoders import backend_available, make_video_decoder
    from mmdata.codecs.decoders.availability import cuda_available

    if cuda_available():
        pytest.skip("a CUDA GPU is visible: the GPU check script covers decoder='hybrid' there")
    assert not backend_available("hybrid")
    with pytest.raises(mmdata.errors.MmdataError, match="decoder 'hybrid' needs"):
        make_video_decoder("hybrid", ["h264"])


@pytest.mark.slow
def test_with_main_process_decoding_the_workers_decode_the_tail_and_the_share_follows_the_rates(stores):
    spec = mmdata.Windows(anchor_fps=10, streams={"cam_high": mmdata.Frames(offsets=[-0.1, 0.0])})

    def run(decoder):
        loader = mmdata.DataLoader(
            str(stores["wds"]),
            spec,
            batch_size=8,
            num_workers=2,
            seed=4,
            runtime=mmdata.Runtime(decoder=decoder, decode_in="main"),
        )
        return loader, [(b["sample_index"], b["cam_high"]) for b in loader]

    _, single = run("pyav")
    loader, shared = run(HybridDecoder(PyAvDecoder(), SlowPyAv(delay=0.01)))
    assert len(single) == len(shared)
    for (ids, frames), (shared_ids, shared_frames) in zip(single, shared):
        assert torch.equal(ids, shared_ids) and torch.equal(frames, shared_frames)
    hybrid = loader.decoder
    assert hybrid.split.first_share > 0.6, "the slow workers' side was measured and given less"
    assert 0 < hybrid.first.stats.requests < hybrid.stats.requests, "the main process decoded only the heads"
    assert hybrid.second.stats.requests == 0, "the tails were decoded in the workers"
    main_share = hybrid.first.stats.frames_delivered / hybrid.stats.frames_delivered
    assert main_share > 0.6, "the workers cut at the share the main process learnt and published"

"""Frames at model resolution: resize modes against torch references, seeded crops, channels first."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import mmdata
from mmdata.codecs.decoders import ClipRequest
from mmdata.codecs.decoders.base import SequentialDecoder
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder
from mmdata.codecs.geometry import FrameGeometry, fit_frames, frame_geometry

# Stated accuracy: frames scaled inside the decode are within this mean absolute error (levels of
# 255) of torch's antialiased resize of the full decoded frame.
RESIZE_MAE = 1.5
SIZE = (96, 128)


def _windows(resize: mmdata.Resize | None, **frames) -> mmdata.Windows:
    return mmdata.Windows(anchor_fps=4, streams={"cam_high": mmdata.Frames(offsets=[0.0], resize=resize, **frames)})


def _batches(store, spec, **options) -> list[dict]:
    loader = mmdata.DataLoader(str(store), spec, batch_size=4, shuffle="none", **{"num_workers": 0, **options})
    return list(loader)


def _reference(full: torch.Tensor, mode: str, interpolation: str) -> torch.Tensor:
    """Torch's resize of full frames `[N, H, W, 3]` by `mode`, written independently of mmdata's geometry."""
    frames = full.permute(0, 3, 1, 2).float()
    height, width = frames.shape[-2:]
    out_h, out_w = SIZE
    options = {"mode": "area"} if interpolation == "area" else {"mode": interpolation, "antialias": True}
    if mode == "stretch":
        return torch.nn.functional.interpolate(frames, size=SIZE, **options).permute(0, 2, 3, 1)
    if mode == "shorter_side":
        keep_h, keep_w = (
            (height, height * out_w / out_h) if width / height > out_w / out_h else (width * out_h / out_w, width)
        )
        top, left = round((height - keep_h) / 2), round((width - keep_w) / 2)
        crop = frames[..., top : top + round(keep_h), left : left + round(keep_w)]
        return torch.nn.functional.interpolate(crop, size=SIZE, **options).permute(0, 2, 3, 1)
    factor = min(out_h / height, out_w / width)
    fit_h, fit_w = round(height * factor), round(width * factor)
    scaled = torch.nn.functional.interpolate(frames, size=(fit_h, fit_w), **options)
    out = torch.zeros((len(frames), 3, out_h, out_w))
    top, left = (out_h - fit_h) // 2, (out_w - fit_w) // 2
    out[..., top : top + fit_h, left : left + fit_w] = scaled
    return out.permute(0, 2, 3, 1)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stretch", "shorter_side", "pad"])
@pytest.mark.parametrize("interpolation", ["area", "bilinear"])
def test_resized_frames_match_torch_resize_of_the_full_frame(store, mode, interpolation):
    full = torch.cat([b["cam_high"][:, 0] for b in _batches(store, _windows(None))])
    resized = torch.cat(
        [b["cam_high"][:, 0] for b in _batches(store, _windows(mmdata.Resize(SIZE, mode, interpolation)))]
    )
    assert resized.shape == (len(full), *SIZE, 3) and resized.dtype == torch.uint8
    error = (resized.float() - _reference(full, mode, interpolation)).abs().mean()
    assert error < RESIZE_MAE, f"mean absolute error {error:.3f}"


class FullSizeDecoder(SequentialDecoder):
    """A backend that cannot resize while it decodes: it hands full frames to the base class."""

    name = "full-size"
    codecs = PyAvDecoder.codecs

    def __init__(self):
        super().__init__()
        self.inner = PyAvDecoder()

    def describe(self) -> str:
        return "full-size test backend"

    def _decode_one(self, request):
        (frames,) = self.inner.decode([dataclasses.replace(request, geometry=None)])
        return frames, len(frames)


@pytest.mark.parametrize("mode", ["stretch", "shorter_side", "pad"])
def test_backends_that_cannot_resize_while_decoding_get_the_same_frames_fitted_after(stores, mode):
    dataset = mmdata.open_dataset(str(stores["wds"]))
    plan = dataset.plan_frames(0, "cam_high", [0.0, 0.5, 1.0])
    geometry = frame_geometry(224, 224, SIZE, mode)
    requests = [dataclasses.replace(r, geometry=geometry) for r in plan.requests]
    inside, after = PyAvDecoder().decode(requests), FullSizeDecoder().decode(requests)
    for a, b in zip(inside, after):
        assert a.shape == b.shape == (len(a), *SIZE, 3)
        assert np.abs(a.astype(float) - b).mean() < RESIZE_MAE


def test_channels_first_is_the_same_frames_transposed(store):
    resize = mmdata.Resize(SIZE)
    last = torch.cat([b["cam_high"] for b in _batches(store, _windows(resize))])
    first = torch.cat([b["cam_high"] for b in _batches(store, _windows(resize, channels_first=True))])
    assert first.shape == (len(last), 1, 3, *SIZE)
    assert torch.equal(first, last.permute(0, 1, 4, 2, 3))
    unresized = torch.cat([b["cam_high"] for b in _batches(store, _windows(None, channels_first=True))])
    assert unresized.shape[-3:] == (3, 224, 224)


@pytest.mark.parametrize("delivery", ["full", "pad", "display_size"])
def test_pyav_converts_channels_first_frames_straight_into_their_layout(stores, delivery):
    dataset = mmdata.open_dataset(str(stores["wds"]))
    plan = dataset.plan_frames(0, "cam_high", [0.0, 0.5, 1.0])
    options = {
        "full": {},
        "pad": {"geometry": frame_geometry(224, 224, SIZE, "pad")},
        "display_size": {"display_size": (200, 180)},
    }[delivery]
    requests = [dataclasses.replace(r, **options) for r in plan.requests]
    interleaved = PyAvDecoder().decode(requests)
    planar = PyAvDecoder().decode([dataclasses.replace(r, channels_first=True) for r in requests])
    for a, b in zip(interleaved, planar):
        assert b.shape == a.transpose(0, 3, 1, 2).shape and np.array_equal(b, a.transpose(0, 3, 1, 2))


def _random_crop_spec() -> mmdata.Windows:
    resize = mmdata.Resize(SIZE, mode="stretch", crop="random", scale=(0.2, 0.5))
    return mmdata.Windows(anchor_fps=8, streams={"cam_high": mmdata.Frames(offsets=[-0.1, 0.0], resize=resize)})


@pytest.mark.slow
def test_random_crops_are_the_same_across_worker_counts_and_resume(store):
    def build(workers: int = 0):
        return mmdata.DataLoader(str(store), _random_crop_spec(), batch_size=4, num_workers=workers, seed=5)

    alone = [b["cam_high"] for b in build()]
    with_workers = [b["cam_high"] for b in build(2)]
    assert all(torch.equal(a, b) for a, b in zip(alone, with_workers)) and len(alone) == len(with_workers)
    first = build()
    iterator = iter(first)
    head = [next(iterator)["cam_high"] for _ in range(2)]
    state = first.state_dict()
    resumed = build(2)
    resumed.load_state_dict(state)
    tail = [b["cam_high"] for b in resumed]
    assert all(torch.equal(a, b) for a, b in zip(head + tail, alone))


def test_random_crops_differ_by_sample_and_epoch_but_not_by_frame_within_a_sample(stores):
    loader = mmdata.DataLoader(
        str(stores["wds"]), _random_crop_spec(), batch_size=4, shuffle="none", seed=5, num_workers=0
    )
    first_epoch = torch.cat([b["cam_high"] for b in loader])
    second_epoch = torch.cat([b["cam_high"] for b in loader])
    assert not torch.equal(first_epoch, second_epoch), "a new epoch draws new crops"
    plain = torch.cat([b["cam_high"] for b in _batches(stores["wds"], _windows(mmdata.Resize(SIZE, "stretch")))])
    assert (first_epoch[:, 1].float() - plain.float()).abs().mean() > 10, "a crop of 20-50% is no full frame"


def test_random_boxes_follow_the_scale_and_ratio_ranges_on_even_pixels():
    rng = np.random.default_rng(0)
    for _ in range(500):
        geometry = frame_geometry(640, 480, (224, 224), "stretch", crop="random", scale=(0.08, 1.0), rng=rng)
        top, left, height, width = geometry.box
        assert top % 2 == left % 2 == height % 2 == width % 2 == 0
        assert top >= 0 and top + height <= 480 and left >= 0 and left + width <= 640
        assert 0.06 <= height * width / (640 * 480) <= 1.0
        assert 3 / 4 * 0.9 <= width / height <= 4 / 3 * 1.1 or (height, width) in ((480, 640), (480, 480))


def test_letterbox_places_the_whole_frame_inside_black_bars():
    geometry = frame_geometry(640, 480, (224, 224), "pad")
    assert geometry.box == (0, 0, 480, 640) and geometry.place == (28, 0, 168, 224)
    frames = np.full((1, 480, 640, 3), 200, np.uint8)
    out = fit_frames(frames, geometry)
    assert (out[0, :28] == 0).all() and (out[0, -28:] == 0).all() and (out[0, 28:196] == 200).all()
    assert FrameGeometry((224, 224), (0, 0, 480, 640), (0, 0, 224, 224)).covers(640, 480)


def test_resize_options_are_checked_when_the_spec_is_made():
    with pytest.raises(mmdata.SpecError, match="resize mode 'fit'"):
        mmdata.Resize((224, 224), mode="fit")
    with pytest.raises(mmdata.SpecError, match="centre crop is mode='shorter_side'"):
        mmdata.Resize((224, 224), crop="center")
    with pytest.raises(mmdata.SpecError, match="inside \\(0, 1\\]"):
        mmdata.Resize((224, 224), crop="random", scale=(0.5, 1.5))
    with pytest.raises(mmdata.SpecError, match="resize takes mmdata.Resize"):
        mmdata.Frames(resize=(224, 224))


def test_unchanged_specs_keep_their_resume_fingerprint():
    plain = _windows(None)
    assert "resize" not in plain.describe()["streams"]["cam_high"]
    assert "channels_first" not in plain.describe()["streams"]["cam_high"]
    assert "resize" in _windows(mmdata.Resize(SIZE)).describe()["streams"]["cam_high"]


def test_clip_request_geometry_decodes_straight_to_the_requested_size(stores):
    dataset = mmdata.open_dataset(str(stores["zarr"]))
    request = dataset.plan_frames(1, "cam_wrist", [0.0]).requests[0]
    fitted = PyAvDecoder().decode([dataclasses.replace(request, geometry=frame_geometry(208, 160, (50, 70), "pad"))])
    assert fitted[0].shape == (1, 50, 70, 3)
    assert isinstance(request, ClipRequest) and request.geometry is None


@given(
    width=st.integers(2, 4096),
    height=st.integers(2, 4096),
    out_h=st.integers(1, 1024),
    out_w=st.integers(1, 1024),
)
def test_a_centre_crop_edge_lies_at_most_one_source_pixel_from_the_exact_one(width, height, out_h, out_w):
    """What docs/training-batches.md ("Accuracy") promises of the even-pixel box a "shorter_side" crop keeps."""
    geometry = frame_geometry(width, height, (out_h, out_w), "shorter_side")
    top, left, box_h, box_w = geometry.box
    factor = max(out_h / height, out_w / width)
    exact_h, exact_w = min(height, out_h / factor), min(width, out_w / factor)
    exact_top, exact_left = (height - exact_h) / 2, (width - exact_w) / 2
    assume(exact_h >= 2 and exact_w >= 2)  # (a box is at least 2x2: 4:2:0 chroma)
    assert top % 2 == 0 and left % 2 == 0 and top >= 0 and top + box_h <= height and left + box_w <= width
    edges = (top, left, top + box_h, left + box_w)
    exact = (exact_top, exact_left, exact_top + exact_h, exact_left + exact_w)
    assert all(abs(found - wanted) <= 1.0 + 1e-9 for found, wanted in zip(edges, exact)), (edges, exact)

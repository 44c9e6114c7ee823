"""NV12 frames (what NVDEC writes) to RGB on the device they are on, the way the CPU path converts.

The same arithmetic as `colour`'s kernel (BT.601, limited range, centred chroma upsampled
bilinearly with weights 3/4 and 1/4 and edges repeated, float32, rounded to nearest), written with
torch so that it runs on the GPU beside the decoder, and on the CPU for the tests: frames decoded
on the GPU then match frames decoded by PyAV on the host.
"""

from __future__ import annotations

from typing import Any


def nv12_to_rgb(nv12: Any, height: int) -> Any:
    """uint8 NV12 `[..., 3 * height / 2, W]` (luma rows, then interleaved U, V rows) as uint8 RGB
    `[..., height, W, 3]`, on the same device."""
    import torch

    if height % 2 or nv12.shape[-2] < height * 3 // 2 or nv12.shape[-1] % 2:
        raise ValueError(f"NV12 frames of {height} rows need even sizes and {height * 3 // 2} rows, not {nv12.shape}")
    luma = nv12[..., :height, :].float()
    chroma = nv12[..., height : height * 3 // 2, :].float().unflatten(-1, (-1, 2))  # [..., H/2, W/2, (U, V)]
    rows = torch.arange(height, device=nv12.device)
    near = rows // 2
    far = torch.where(rows % 2 == 1, (near + 1).clamp(max=height // 2 - 1), (near - 1).clamp(min=0))
    vertical = 3 * chroma[..., near, :, :] + chroma[..., far, :, :]
    padded = torch.cat([vertical[..., :1, :], vertical, vertical[..., -1:, :]], dim=-2)
    middle = 3 * padded[..., 1:-1, :]
    full = torch.stack([middle + padded[..., :-2, :], middle + padded[..., 2:, :]], dim=-2).flatten(-3, -2)
    u = full[..., 0] * (1 / 16) - 128
    v = full[..., 1] * (1 / 16) - 128
    y = (luma - 16) * (255 / 219) + 0.5
    red = y + 1.596026786 * v
    green = y - 0.391762290 * u - 0.812967647 * v
    blue = y + 2.017232143 * u
    return torch.stack([red, green, blue], dim=-1).clamp_(0, 255).to(torch.uint8)

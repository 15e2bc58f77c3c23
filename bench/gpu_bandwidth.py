"""The bandwidth floor's denominator, measured in the run that reports against it (the GPU benches use it)."""

import numpy as np
import torch


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 2 GiB, bytes read + written per second (median of 20)."""
    src = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return 2 * src.numel() * src.element_size() / np.median(times[5:]) / 1e9

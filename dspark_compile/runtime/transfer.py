"""Copies between the host and the device that do not wait for the device. A plain copy
from pageable host memory to a GPU, or back, first waits for everything queued on the
stream; in a draft -> verify loop that stalls the host until the target's pass is done,
and the device then idles while the host issues the next round. These go through pinned
memory and are queued like kernels instead."""

from __future__ import annotations

from typing import Union

import torch
from torch import Tensor


def upload(values: Union[list, Tensor], device: torch.device,
           dtype: torch.dtype = torch.long) -> Tensor:
    """``values`` (a list, or a host tensor) on ``device``, queued behind the stream's work
    instead of waiting for it."""
    host = values if isinstance(values, Tensor) else torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device, copy=True)
    return host.pin_memory().to(device, non_blocking=True)


def download(tensor: Tensor) -> Tensor:
    """``tensor`` copied into host memory by the stream, in order with its other work: the
    values are there once the host has waited for a later point of the stream (the
    runner's download of the next round, for one). Read it before and it may still be
    filling."""
    if tensor.device.type != "cuda":
        return tensor.clone()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)

"""Devices: ``torch.device`` is the representation; helpers for printing."""
from __future__ import annotations

import torch

cpu = torch.device("cpu")


def to_device(d) -> torch.device:
    """Accept what torch accepts: a device, a string, an int (cuda index), None
    (cpu). A CUDA device without an index is the current one, as the tensor
    torch makes there says (``cuda:0``), so proxies compare equal to those of
    the inputs beside them."""
    if d is None:
        return cpu
    if isinstance(d, int):
        return torch.device("cuda", d)
    d = d if isinstance(d, torch.device) else torch.device(d)
    if d.type == "cuda" and d.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return d


def short_name(d: torch.device) -> str:
    return d.type if d.index is None else f"{d.type}:{d.index}"

"""Devices: ``torch.device`` is the representation; helpers for printing."""
from __future__ import annotations

import torch

cpu = torch.device("cpu")


def to_device(d) -> torch.device:
    """Accept what torch accepts: a device, a string, an int (cuda index), None (cpu)."""
    if d is None:
        return cpu
    if isinstance(d, torch.device):
        return d
    if isinstance(d, int):
        return torch.device("cuda", d)
    return torch.device(d)


def short_name(d: torch.device) -> str:
    return d.type if d.index is None else f"{d.type}:{d.index}"

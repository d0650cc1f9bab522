"""Where training runs and what it sets up there: the device, the seeds, the peak memory it reports."""

from __future__ import annotations

import random
import resource

import torch

from seqrec.errors import SeqrecError


def pick_device(name: str, setting: str = "train.device") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SeqrecError(f"{setting}: {name!r} is not a device (auto, cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch was built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise SeqrecError(f"{setting} {name!r}: {why} (use cpu, or auto: CUDA where there is one)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise SeqrecError(f"{setting} {name!r}: there are {torch.cuda.device_count()} CUDA device(s)")
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def peak_rss_mb() -> float:
    """This process's peak resident memory, MB: the kernel's high-water mark of its own memory (VmHWM), which
    starts again at exec; `ru_maxrss` where there is none, which on Linux keeps a forking parent's peak."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

"""
The memory a job may use: this machine's, or its GPU's, against which a tool refuses sizes that
cannot fit before it allocates anything.

    total = device_memory("cuda:0")   # bytes: the GPU's; the machine's (cpu, mps); None: unknown
"""

import os
import sys

import torch


def physical_memory():
    """This machine's memory in bytes, or None where it cannot be told."""
    try:
        if sys.platform == "win32":
            import ctypes

            class Status(ctypes.Structure):
                _fields_ = [("length", ctypes.c_ulong), ("load", ctypes.c_ulong)] + \
                           [(n, ctypes.c_ulonglong) for n in ("total", "free", "pt", "pf", "vt",
                                                              "vf", "ve")]
            status = Status(length=ctypes.sizeof(Status))
            ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))
            return status.total
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def device_memory(device):
    """The memory of the device tensors go to, in bytes: a CUDA GPU's own; for cpu and mps (whose
    GPU shares the machine's memory) the machine's; None where it cannot be told."""
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return physical_memory()

"""Keeping glibc from handing a training loop's freed memory back to the kernel after every update.

glibc's ``malloc`` serves a request of at least its *mmap threshold* (128 KiB when a process starts) with fresh
pages mapped for it alone, and gives the free space at the top of its heap back to the kernel once that space
exceeds its *trim threshold*. Both thresholds adapt: freeing a mapped block of up to 32 MiB raises the mmap
threshold to that block's size and the trim threshold to twice it. A process whose largest freed block so far is
a few MiB therefore trims its heap whenever an update frees more than twice that, and the next update takes a
page fault for each 4 KiB it writes again. MA-POCA's update does this with its critic's attention tensors
(2.4 MB each at ``benchmarks.poca_vs_supersuit``'s settings: 1,100-1,900 faults per minibatch), PPO with
``CnnPolicy`` with its convolutions' activations (``benchmarks.ppo_cnn``'s 64x64 frames: about 150 faults per env
step). On a 2-core AMD EPYC the faults made POCA's runs about 4% longer and ``CnnPolicy`` PPO's 16-32% longer
(``benchmarks/RESULTS.md``, "Page faults after each update"); PPO and SAC on MLPs of 64 or 256 units took none.

:func:`raise_heap_thresholds` frees one mapped block of :data:`SCRATCH_BYTES` before training, which moves both
thresholds as the largest block the process ever freed would: requests under 30 MiB then come from the heap,
which keeps up to twice that free. Nothing else changes: no allocation is kept, and where a user fixed the
thresholds (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or ``mallopt``) glibc does not adapt them.
Under other C libraries (musl, macOS, Windows) it does nothing; an allocator loaded in glibc's place (jemalloc,
tcmalloc) gets one allocation and its free.
"""

from __future__ import annotations

import ctypes
import platform
import sys

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
"""Whether this process runs on Linux with glibc, the C library whose thresholds this module moves."""

SCRATCH_BYTES = 30 << 20
"""The block freed once: under glibc's 32 MiB cap on the adaptive mmap threshold, with room for its header."""

_raised = False


def raise_heap_thresholds() -> bool:
    """Free one block of :data:`SCRATCH_BYTES` the first time this is called in a process on Linux with glibc
    (see the module's text); returns whether it did so now."""
    global _raised
    if _raised or not GLIBC:
        return False
    _raised = True
    libc = c_library()
    block = libc.malloc(SCRATCH_BYTES)  # mapped, never written: no page is touched
    libc.free(block)  # free(NULL), should malloc fail, does nothing
    return True


def c_library() -> ctypes.CDLL:
    """The process's own C library, with ``malloc`` and ``free`` typed: the ones PyTorch and NumPy allocate with."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc

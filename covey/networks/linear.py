"""Linear layers whose large float32 matrix multiplies on CPU run in oneDNN where MKL is slow.

PyTorch multiplies float32 matrices on CPU with MKL, which takes its fastest (AVX-512) code only on Intel
CPUs. On other x86 CPUs oneDNN, which PyTorch also ships, multiplies the large ones about twice as fast:
150 us against 306 us for 256x256x256 on one core of an AVX-512 AMD EPYC (``python -m
benchmarks.fast_paths``). So there, and only for products of at least :data:`ONEDNN_MIN_MACS` multiply-adds
(below, oneDNN's fixed cost outweighs the gain), covey computes in oneDNN. Both libraries compute in float32:
results differ by summation order only, as between any two BLAS libraries.

:func:`linear` is ``F.linear`` with that choice, differentiable (the backward's two products choose the same
way); :class:`Linear` is an ``nn.Linear`` that calls it. Everything else (Intel or non-x86 CPUs, a PyTorch
whose BLAS is not MKL or that has no oneDNN, other devices and dtypes, autocast, tracing or export) takes
``F.linear`` unchanged. ``covey.networks.linear.ONEDNN`` is the switch.
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

ONEDNN_MIN_MACS = 1 << 21
"""Multiply-adds from which a product goes to oneDNN (measured: MKL wins below ~1M, oneDNN from ~4M)."""

_onednn_linear = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
AVAILABLE = _onednn_linear is not None and torch.backends.mkldnn.is_available()
"""Whether this PyTorch can multiply in oneDNN."""


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()  # Windows: "... GenuineIntel" or "... AuthenticAMD"


def _mkl_without_its_fast_path() -> bool:
    """Whether PyTorch's BLAS is MKL on an x86 CPU that is not Intel's."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    vendor = _cpu_vendor()
    return torch.backends.mkl.is_available() and x86 and bool(vendor) and "GenuineIntel" not in vendor


ONEDNN = AVAILABLE and _mkl_without_its_fast_path()
"""Whether covey sends large float32 CPU products to oneDNN here (set it to False to keep them in MKL)."""


_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


def _autocast_on() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # PyTorch < 2.4
        return torch.is_autocast_cpu_enabled()


def in_onednn(rows: int, inner: int, cols: int) -> bool:
    """Whether the product ``(rows, inner) @ (inner, cols)`` goes to oneDNN. (MKL is also slow on a few output
    columns after a long inner dimension, 48 us against 20 us for 256x256x4 alone, but sending those to oneDNN
    too measured no gain on SAC's gradient step, where the critics' first layers have them.)"""
    return rows * inner * cols >= ONEDNN_MIN_MACS


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` in oneDNN for 2-D float32 CPU tensors, no questions asked (hand-written
    gradients call it where :func:`in_onednn` says so; ``weight`` may be a transposed view)."""
    return _onednn_linear(x, weight, bias, "none", [], "")


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 2-D float32 CPU tensors, in oneDNN where :func:`in_onednn` says so."""
    if in_onednn(a.shape[0], a.shape[1], b.shape[1]):
        return _onednn_linear(a, b.t(), None, "none", [], "")
    return a @ b


class _Linear(torch.autograd.Function):
    """``F.linear`` on a 2-D input whose forward and backward products each take the faster library."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        if in_onednn(x.shape[0], x.shape[1], weight.shape[0]):
            return _onednn_linear(x, weight, bias, "none", [], "")
        return F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors  # x: (rows, in), grad: (rows, out)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(grad, weight)
        if ctx.needs_input_grad[1]:
            grad_weight = _product(grad.t(), x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_weight, grad_bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, with float32 CPU products in oneDNN where faster (see the module's notes).

    >>> x, w, b = torch.randn(512, 128), torch.randn(64, 128), torch.randn(64)
    >>> torch.allclose(linear(x, w, b), F.linear(x, w, b), atol=1e-4)
    True
    """
    if not (
        ONEDNN
        and type(x) is torch.Tensor  # not a traced, fake or otherwise special tensor
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.dim() >= 2
        and not _autocast_on()
        and not _compiling()
    ):
        return F.linear(x, weight, bias)
    n_out, n_in = weight.shape
    rows = x.numel() // n_in
    forward = in_onednn(rows, n_in, n_out)
    if torch.is_grad_enabled():
        backward = (x.requires_grad and in_onednn(rows, n_out, n_in)) or (
            weight.requires_grad and in_onednn(n_out, rows, n_in)
        )
        differentiable = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    else:
        backward = differentiable = False
    if not (forward or backward):
        return F.linear(x, weight, bias)
    # 2-D in and out: oneDNN returns N-D outputs as views, and the output of a plain 2-D input must not be one
    # either (an in-place activation on a view makes autograd copy the whole tensor).
    flat = x if x.dim() == 2 else x.reshape(-1, n_in)
    out = _Linear.apply(flat, weight, bias) if differentiable else _onednn_linear(flat, weight, bias, "none", [], "")
    return out if x.dim() == 2 else out.view(*x.shape[:-1], n_out)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, state dict and initialization) computed by :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

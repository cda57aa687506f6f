"""Linear layers whose large float32 matrix multiplies on CPU run in oneDNN where MKL is slow.

PyTorch multiplies float32 matrices on CPU with MKL, which takes its fastest (AVX-512) code only on Intel
CPUs. On other x86 CPUs with AVX-512 oneDNN, which PyTorch also ships, multiplies the large ones about twice as
fast: 155 us against 311 us for 256x256x256 on one core of an AVX-512 AMD EPYC (``python -m
benchmarks.fast_paths``). So there, and only for layers of at least :data:`ONEDNN_MIN_WEIGHTS` weights on
batches of at least :data:`ONEDNN_MIN_ROWS` rows (below, oneDNN's fixed cost outweighs the gain), covey
computes in oneDNN. Both libraries compute in float32: results differ by summation order only, as between
any two BLAS libraries. On CPUs without AVX-512 both libraries run AVX2 code at about the same speed (a
256x256x256 forward 0.94x MKL's time in oneDNN on an AVX2 AMD EPYC, 1.04x on another), and oneDNN's copies
of transposed operands, which MKL reads in place, make the updates no faster or slower: there covey keeps MKL
(:data:`ONEDNN`).

:func:`linear` is ``F.linear`` with that choice, differentiable (the backward's two products in oneDNN too);
:class:`Linear` is an ``nn.Linear`` that calls it. Everything else (Intel or non-x86 CPUs, a PyTorch
whose BLAS is not MKL or that has no oneDNN, other devices and dtypes, autocast, tracing or export) takes
``F.linear`` unchanged. ``covey.networks.linear.ONEDNN`` is the switch.

A second case is a layer on few input features (a first layer on a small observation, a critic's on an
observation and an action): on the same CPU MKL computes both of its gradient products several times slower
than their transposes, so that a 4 -> 256 layer's forward and backward on 256 samples takes 72 us this way
against 140 us (``python -m benchmarks.fast_paths``). On float32 CPU tensors such layers (:func:`narrow`) take
their gradients as those transposed products; the forward product is ``F.linear``'s.
``covey.networks.linear.NARROW`` is the switch, off on Intel CPUs (:data:`INTEL_MKL`), where MKL's own
products are the fast ones. It governs autograd's layers only: the hand-written gradients of
:class:`covey.networks.mlp.ManualMLP` pick their transposed weight gradients by a rule of their own.
"""

from __future__ import annotations

import functools
import platform
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

ONEDNN_MIN_WEIGHTS = 8192
"""Layers with at least this many weights (64x128 and up) multiply in oneDNN: 2M multiply-adds on 256 rows
(measured: MKL wins below ~1M, oneDNN from ~4M)."""
ONEDNN_MIN_ROWS = 32
"""... on batches of at least this many rows (acting on a few observations stays in MKL)."""

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


def _mkl_on(intel: bool) -> bool:
    """Whether PyTorch's BLAS is MKL on an x86 CPU that is Intel's (``intel``) or another vendor's."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    vendor = _cpu_vendor()
    return torch.backends.mkl.is_available() and x86 and bool(vendor) and ("GenuineIntel" in vendor) == intel


INTEL_MKL = _mkl_on(intel=True)
"""Whether PyTorch's BLAS is MKL on an Intel CPU, where MKL and its vector math take their fast code: there
the products of layers on few inputs, and ``torch.tanh``, need none of the detours below (on a Xeon of family
6 model 207 the transposed input gradient of a 4 -> 256 layer on 256 samples is the slow form, and
``torch.tanh`` of 64x64 took 3.1 us against 11.2 us for ``2 * sigmoid(2x) - 1``; ``python -m
benchmarks.fast_paths``)."""


def _avx512() -> bool:
    """Whether PyTorch runs its AVX-512 kernels on this CPU."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _onednn_pays() -> bool:
    """Whether large float32 products go to oneDNN by default: MKL on an x86 CPU other than Intel's, with AVX-512."""
    return AVAILABLE and _mkl_on(intel=False) and _avx512()


ONEDNN = _onednn_pays()
"""Whether covey sends large float32 CPU products to oneDNN here (set it to False to keep them in MKL): on x86
CPUs other than Intel's, with AVX-512. On an AVX2 AMD EPYC (Zen 2) SAC's gradient step took 1.02x its time in
MKL with them in oneDNN and MA-POCA's minibatch 1.04x (``python -m benchmarks.fast_paths --groups sac,poca``,
"large products in oneDNN" against "all in MKL")."""


NARROW = not INTEL_MKL
"""Whether float32 CPU layers on few input features take their gradients as transposed products (:func:`narrow`):
not on Intel CPUs with MKL, where SAC's autograd step gained nothing from them (0.97-1.12x the time over four
runs of ``python -m benchmarks.fast_paths``), so ``F.linear`` keeps those layers."""
TRANSPOSED_INPUT_GRADS = not INTEL_MKL
"""... their input gradients too (and :class:`~covey.networks.mlp.ManualMLP`'s input gradients): MKL is slow at
``grad @ weight`` with few output columns except on Intel CPUs, where the transposed product is the slow one."""
NARROW_MAX_INPUTS = 32
"""Layers with fewer inputs than this ..."""
NARROW_MIN_OUTPUTS = 64
"""... and at least this many outputs ..."""
NARROW_MIN_OUTPUT_SIZE = 32768
"""... on batches where rows x outputs reaches this (256 x 128) take the transposed gradients."""

_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
_tracing = getattr(torch._C, "_is_tracing", torch.jit.is_tracing)  # is_tracing() without its scripting test


def fast_bfloat16_products() -> bool:
    """Whether this PyTorch multiplies bfloat16 matrices on the CPU in oneDNN (x86 CPUs with AVX-512, Arm CPUs
    with bfloat16 instructions). Elsewhere, on AVX2 CPUs for one, it falls back to a plain loop: a 256x256x256
    product took 25.6 ms against 0.40 ms in float32 on an AVX2 AMD EPYC (``python -m benchmarks.fast_paths
    --groups kernels``). A PyTorch that cannot tell counts as fast."""
    check = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    if check is None:
        return True
    try:
        return bool(check())
    except (RuntimeError, AttributeError):
        return True


@functools.cache
def bfloat16_product_speedup(size: int = 256, repeats: int = 7) -> float:
    """How many times faster a ``size``-cubed matrix product runs in bfloat16 than in float32 on this CPU (one
    thread of it, as the caller runs), measured once per process (the fastest of ``repeats`` runs each, a few
    milliseconds in all). Below 1 where oneDNN takes bfloat16 but has no fast kernel for it: on an Intel Xeon
    (Emerald Rapids) whose virtual machine exposed AVX-512 BF16 without AMX it was 0.53 (1.9x the time)."""
    own = torch.Generator().manual_seed(0)  # the global generator stays as a seeded run set it
    a, b = torch.randn(size, size, generator=own), torch.randn(size, size, generator=own)
    times = []
    for x, w in ((a, b), (a.bfloat16(), b.bfloat16())):
        F.linear(x, w)  # the first call sets oneDNN's kernel up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            F.linear(x, w)
            best = min(best, time.perf_counter() - start)
        times.append(best)
    return times[0] / max(times[1], 1e-9)


def autocast_on() -> bool:
    """Whether autocast is on, on the CPU or on CUDA."""
    try:
        return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")
    except TypeError:  # PyTorch < 2.4
        return torch.is_autocast_cpu_enabled() or torch.is_autocast_enabled()


def in_onednn(rows: int, n_in: int, n_out: int) -> bool:
    """Whether a layer of ``n_in`` inputs and ``n_out`` outputs on ``rows`` samples multiplies in oneDNN: its
    forward product and both gradient products. The layer decides, not the exact batch size, so every part
    of a batch (of at least :data:`ONEDNN_MIN_ROWS` rows) gets outputs bit-identical to the batch's own rows:
    a rollout evaluated at once agrees exactly with its minibatches. (MKL is also slow on the gradients of a
    layer on a few features; such layers take them transposed instead, :func:`narrow`, which measured faster
    on SAC's gradient step than sending them to oneDNN.)"""
    return rows >= ONEDNN_MIN_ROWS and n_in * n_out >= ONEDNN_MIN_WEIGHTS


def narrow(rows: int, n_in: int, n_out: int) -> bool:
    """Whether a layer of ``n_in`` inputs and ``n_out`` outputs on ``rows`` samples takes its gradients as
    transposed products: ``(x^T g)^T`` for the weight, ``(W^T g^T)^T`` for the input. MKL computes those several
    times faster on batches of 256 x 128 outputs and more; on 64 rows, or from 32 inputs on, the two forms come
    out about even. Only the backward changes, so the layer's outputs are ``F.linear``'s exactly."""
    return n_in < NARROW_MAX_INPUTS and n_out >= NARROW_MIN_OUTPUTS and rows * n_out >= NARROW_MIN_OUTPUT_SIZE


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` in oneDNN for 2-D float32 CPU tensors, no questions asked (hand-written
    gradients call it where :func:`in_onednn` says so; ``weight`` may be a transposed view)."""
    return _onednn_linear(x, weight, bias, "none", [], "")


def onednn_weight_grad(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A layer's weight gradient ``grad^T @ x`` ``(out, in)`` in oneDNN, from ``grad`` ``(rows, out)`` and its
    input ``x`` ``(rows, in)``. oneDNN copies the transposed left operand into place, so the smaller of the two
    goes there: ``(x^T @ grad)^T`` when the layer has fewer inputs than outputs (a transposed view then)."""
    if x.shape[1] < grad.shape[1]:
        return onednn_linear(x.t(), grad.t()).t()
    return onednn_linear(grad.t(), x.t())


class _Linear(torch.autograd.Function):
    """``F.linear`` on a 2-D input with covey's products: the forward and both gradients in oneDNN
    (``onednn``), or the forward in ``F.linear`` and both gradients transposed (layers on few inputs,
    :func:`narrow`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, onednn: bool) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.onednn = onednn
        return onednn_linear(x, weight, bias) if onednn else F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors  # x: (rows, in), grad: (rows, out)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:  # grad @ weight
            if ctx.onednn:
                grad_x = onednn_linear(grad, weight.t())
            else:
                grad_x = (weight.t() @ grad.t()).t() if TRANSPOSED_INPUT_GRADS else grad @ weight
        if ctx.needs_input_grad[1]:  # grad.T @ x
            grad_weight = onednn_weight_grad(grad, x) if ctx.onednn else (x.t() @ grad).t()
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_weight, grad_bias, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, with float32 CPU products in oneDNN where faster and the gradients of
    layers on few inputs transposed (see the module's notes).

    >>> x, w, b = torch.randn(512, 128), torch.randn(64, 128), torch.randn(64)
    >>> torch.allclose(linear(x, w, b), F.linear(x, w, b), atol=1e-4)
    True
    """
    if (
        _compiling()
        or _tracing()
        or weight.dim() != 2
        or x.dim() < 2
        or weight.shape[1] == 0
        or type(x) is not torch.Tensor
    ):
        # Under TorchScript's tracer (SB3's ONNX and TorchScript recipes), torch.compile or torch.export, where a
        # size test on the batch below would be recorded for one batch size (the tracer warns of it) or be a guard
        # the compiler cannot keep; or a fake or otherwise special tensor.
        return F.linear(x, weight, bias)
    n_out, n_in = weight.shape
    rows = x.numel() // n_in
    onednn = ONEDNN and in_onednn(rows, n_in, n_out)
    differentiable = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    transposed = NARROW and differentiable and not onednn and narrow(rows, n_in, n_out)
    if not (
        (onednn or transposed)
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and not autocast_on()
    ):
        return F.linear(x, weight, bias)
    # 2-D in and out: oneDNN returns N-D outputs as views, and the output of a plain 2-D input must not be one
    # either (an in-place activation on a view makes autograd copy the whole tensor).
    flat = x if x.dim() == 2 else x.reshape(-1, n_in)
    if differentiable:
        out = _Linear.apply(flat, weight, bias, onednn)
    else:
        out = onednn_linear(flat, weight, bias)  # only oneDNN products get here without a gradient to take
    return out if x.dim() == 2 else out.view(*x.shape[:-1], n_out)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, state dict and initialization) computed by :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

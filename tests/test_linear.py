"""covey.networks.linear: large float32 products in oneDNN and transposed gradients of layers on few inputs,
with F.linear's values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from covey.networks import linear as linear_module
from covey.networks.linear import AVAILABLE, Linear, linear
from covey.networks.mlp import mlp

needs_onednn = pytest.mark.skipif(not AVAILABLE, reason="this PyTorch has no oneDNN linear op")


@pytest.fixture(autouse=True)
def onednn_on(monkeypatch):
    """The oneDNN path and the transposed gradients are tested wherever PyTorch has them, also on CPUs where
    covey leaves them off by default."""
    monkeypatch.setattr(linear_module, "ONEDNN", AVAILABLE)
    monkeypatch.setattr(linear_module, "NARROW", True)


def _covey_backward(out: torch.Tensor):
    """The backward node of covey's autograd function for linear layers that made ``out`` (or the tensor it is a
    view of), else None."""
    fn = out.grad_fn
    if type(fn).__name__ == "ViewBackward0":
        fn = fn.next_functions[0][0]
    return fn if type(fn).__name__ == "_LinearBackward" else None


def _through_onednn(out: torch.Tensor) -> bool:
    """Whether ``out`` came out of oneDNN products (forward and gradients)."""
    fn = _covey_backward(out)
    return fn is not None and fn.onednn


def _transposed_gradients(out: torch.Tensor) -> bool:
    """Whether ``out`` is a layer on few inputs whose gradients are transposed products."""
    fn = _covey_backward(out)
    return fn is not None and not fn.onednn


def _grads(fn, x, w, b, grad_out):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    b = None if b is None else b.clone().requires_grad_()
    out = fn(x, w, b)
    inputs = [x, w] + ([] if b is None else [b])
    return out, torch.autograd.grad((out * grad_out).sum(), inputs)


@needs_onednn
@pytest.mark.parametrize("shape", [(512,), (4, 130), (2, 3, 90)])
@pytest.mark.parametrize("n_in, n_out", [(96, 128), (160, 64)])  # the weight gradient transposes x, or grad
@pytest.mark.parametrize("with_bias", [True, False])
def test_large_products_take_onednn_and_equal_f_linear(shape, n_in, n_out, with_bias):
    torch.manual_seed(0)
    x, w = torch.randn(*shape, n_in), torch.randn(n_out, n_in)
    b = torch.randn(n_out) if with_bias else None
    grad_out = torch.randn(*shape, n_out)
    out, grads = _grads(linear, x, w, b, grad_out)
    ref, ref_grads = _grads(F.linear, x, w, b, grad_out)
    assert _through_onednn(out)
    assert out.shape == ref.shape
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-4)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, rtol=1e-5, atol=1e-3 * r.abs().max().item())
    with torch.no_grad():
        assert torch.allclose(linear(x, w, b), ref, rtol=1e-5, atol=1e-4)


@needs_onednn
def test_the_layer_decides_so_any_part_of_a_batch_gets_the_same_outputs():
    """Rows of a batch and of any part of it (of at least ONEDNN_MIN_ROWS) come out bit-identical: a rollout
    evaluated at once agrees exactly with its minibatches."""
    torch.manual_seed(0)
    x, w, b = torch.randn(2048, 64), torch.randn(64, 64), torch.randn(64)  # 4096 weights: MKL at any batch
    assert torch.equal(linear(x, w, b)[:64], linear(x[:64], w, b))
    x, w, b = torch.randn(2048, 128), torch.randn(128, 128), torch.randn(128)  # oneDNN from 32 rows
    assert torch.equal(linear(x, w, b)[:32], linear(x[:32], w, b))
    assert torch.equal(linear(x, w, b)[100:164], linear(x[100:164], w, b))
    small = linear(x[:8].requires_grad_(), w)  # acting on a few observations stays in MKL
    assert not _through_onednn(small)


@needs_onednn
def test_in_place_activation_after_a_onednn_product_keeps_gradients():
    """An in-place ReLU right after the layer (covey's MLPs do that) must not hit a view of the output."""
    torch.manual_seed(0)
    net = nn.Sequential(Linear(64, 256), nn.ReLU(inplace=True), Linear(256, 256), nn.ReLU(inplace=True))
    ref = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
    ref.load_state_dict(net.state_dict())
    x = torch.randn(256, 64)
    net(x).square().sum().backward()
    ref(x).square().sum().backward()
    for p, q in zip(net.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-4 * q.grad.abs().max().item())


def test_small_products_other_dtypes_and_autocast_stay_with_f_linear(monkeypatch):
    x = torch.randn(8, 16, requires_grad=True)
    assert not _through_onednn(linear(x, torch.randn(4, 16)))
    big = torch.randn(512, 128, dtype=torch.float64, requires_grad=True)
    assert not _through_onednn(linear(big, torch.randn(96, 128, dtype=torch.float64)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(torch.randn(512, 128), torch.randn(96, 128)).dtype == torch.bfloat16
    monkeypatch.setattr(linear_module, "ONEDNN", False)
    assert not _through_onednn(linear(torch.randn(512, 128, requires_grad=True), torch.randn(96, 128)))


def test_mkl_is_told_apart_by_the_cpus_vendor(monkeypatch):
    """oneDNN for MKL on x86 CPUs other than Intel's; MKL's own fast code (no detours) on Intel's; neither
    without MKL or off x86."""
    monkeypatch.setattr(linear_module.torch.backends.mkl, "is_available", lambda: True)
    monkeypatch.setattr(linear_module.platform, "machine", lambda: "x86_64")
    for vendor, other, intel in (("AuthenticAMD", True, False), ("GenuineIntel", False, True), ("", False, False)):
        monkeypatch.setattr(linear_module, "_cpu_vendor", lambda vendor=vendor: vendor)
        assert linear_module._mkl_on(intel=False) is other
        assert linear_module._mkl_on(intel=True) is intel
    monkeypatch.setattr(linear_module, "_cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(linear_module.platform, "machine", lambda: "arm64")
    assert not linear_module._mkl_on(intel=False)
    monkeypatch.setattr(linear_module.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(linear_module.torch.backends.mkl, "is_available", lambda: False)
    assert not linear_module._mkl_on(intel=False)
    assert linear_module.TRANSPOSED_INPUT_GRADS is not linear_module.INTEL_MKL


def test_onednn_by_default_only_with_avx512_on_cpus_other_than_intels(monkeypatch):
    """Without AVX-512 oneDNN's AVX2 products are no faster than MKL's, and its copies of transposed operands
    make the updates slower: MKL keeps them there, as on Intel CPUs."""
    monkeypatch.setattr(linear_module, "AVAILABLE", True)
    monkeypatch.setattr(linear_module.torch.backends.mkl, "is_available", lambda: True)
    monkeypatch.setattr(linear_module.platform, "machine", lambda: "x86_64")
    cases = [
        ("AuthenticAMD", "AVX512", True),
        ("AuthenticAMD", "AVX2", False),
        ("AuthenticAMD", "DEFAULT", False),
        ("GenuineIntel", "AVX512", False),
        ("GenuineIntel", "AVX2", False),
    ]
    for vendor, capability, expected in cases:
        monkeypatch.setattr(linear_module, "_cpu_vendor", lambda vendor=vendor: vendor)
        monkeypatch.setattr(linear_module.torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert linear_module._onednn_pays() is expected, (vendor, capability)
    monkeypatch.setattr(linear_module, "AVAILABLE", False)
    monkeypatch.setattr(linear_module, "_cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(linear_module.torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert not linear_module._onednn_pays()


def test_covey_networks_are_built_from_linear_layers_with_nn_linear_state():
    net = mlp(3, [256, 256], nn.ReLU)
    assert all(type(m) is Linear for m in net[0::2])
    ref = nn.Sequential(nn.Linear(3, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
    ref.load_state_dict(net.state_dict())  # same keys and shapes: model files are unchanged
    x = torch.randn(300, 3)
    assert torch.allclose(net(x), ref(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(256, 4), (3, 100, 6), (512, 24)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("transposed_input_grads", [True, False])  # other CPUs' form, Intel MKL's
def test_layers_on_few_inputs_take_transposed_gradients_equal_to_f_linears(
    monkeypatch, shape, with_bias, transposed_input_grads
):
    monkeypatch.setattr(linear_module, "TRANSPOSED_INPUT_GRADS", transposed_input_grads)
    torch.manual_seed(0)
    n_in = shape[-1]
    x, w = torch.randn(*shape), torch.randn(256, n_in)
    b = torch.randn(256) if with_bias else None
    grad_out = torch.randn(*shape[:-1], 256)
    out, grads = _grads(linear, x, w, b, grad_out)
    ref, ref_grads = _grads(F.linear, x, w, b, grad_out)
    assert _transposed_gradients(out)
    assert out.shape == ref.shape
    assert torch.allclose(out, ref, rtol=1e-6, atol=1e-6)  # the forward product is F.linear's
    for g, r in zip(grads, ref_grads):
        assert g.shape == r.shape
        assert torch.allclose(g, r, rtol=1e-5, atol=1e-4 * r.abs().max().item())


def test_transposed_gradients_only_where_they_pay_and_gradients_are_needed(monkeypatch):
    w = torch.randn(256, 4, requires_grad=True)
    assert _transposed_gradients(linear(torch.randn(256, 4), w))  # a weight gradient is enough
    assert linear(torch.randn(256, 4), w.detach()).grad_fn is None  # nothing to differentiate: F.linear
    with torch.no_grad():
        assert linear(torch.randn(256, 4), w).grad_fn is None
    assert not _transposed_gradients(linear(torch.randn(8, 4), w))  # acting on a few observations
    assert not _transposed_gradients(linear(torch.randn(256, 32), torch.randn(256, 32, requires_grad=True)))
    assert not _transposed_gradients(linear(torch.randn(256, 4), torch.randn(32, 4, requires_grad=True)))
    assert not _transposed_gradients(linear(torch.randn(256, 4, dtype=torch.float64), w.double()))
    monkeypatch.setattr(linear_module, "NARROW", False)
    assert not _transposed_gradients(linear(torch.randn(256, 4), w))


def test_in_place_activation_after_a_layer_on_few_inputs_keeps_gradients():
    torch.manual_seed(0)
    net = mlp(4, [256, 256], nn.ReLU)  # 4 -> 256 takes transposed gradients, then ReLU in place
    ref = nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
    ref.load_state_dict(net.state_dict())
    x = torch.randn(256, 4, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    assert _transposed_gradients(net[0](x))
    net(x).square().sum().backward()
    ref(x_ref).square().sum().backward()
    assert torch.allclose(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4 * x_ref.grad.abs().max().item())
    for p, q in zip(net.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-4 * q.grad.abs().max().item())


def test_shapes_that_f_linear_takes_pass_through():
    """A 1-D input or weight, or a layer without inputs: F.linear's results (no division by zero features)."""
    torch.manual_seed(0)
    for x, w in (
        (torch.randn(5), torch.randn(3, 5)),
        (torch.randn(4, 5), torch.randn(5)),
        (torch.randn(300, 0, requires_grad=True), torch.randn(256, 0, requires_grad=True)),
    ):
        assert torch.equal(linear(x, w), F.linear(x, w))


@pytest.mark.parametrize("n_in, n_out", [(4, 256), pytest.param(128, 128, marks=needs_onednn)])
@pytest.mark.parametrize("transposed_input_grads", [True, False])
def test_frozen_layers_give_input_gradients_only(monkeypatch, n_in, n_out, transposed_input_grads):
    """SAC's actor loss reaches the action through critics whose weights are frozen (4 -> 256: transposed
    gradients, the input's transposed or not; 128 -> 128: oneDNN)."""
    monkeypatch.setattr(linear_module, "TRANSPOSED_INPUT_GRADS", transposed_input_grads)
    torch.manual_seed(0)
    x, w, b = torch.randn(256, n_in, requires_grad=True), torch.randn(n_out, n_in), torch.randn(n_out)
    out = linear(x, w, b)
    assert _covey_backward(out) is not None
    grad_out = torch.randn(256, n_out)
    (grad_x,) = torch.autograd.grad((out * grad_out).sum(), [x])
    assert torch.allclose(grad_x, grad_out @ w, rtol=1e-5, atol=1e-4)

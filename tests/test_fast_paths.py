"""The training fast paths against their plain references: flat parameter buffers, the direct fused Adam
step, hand-differentiated MLPs and PPO updates, flat Polyak averaging, bfloat16 SAC and action sampling."""

import importlib
import types
import warnings

import numpy as np
import pytest
import torch
from envs import SpaceEnv, image_space
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import Logger
from torch import nn

from covey import PPO, SAC
from covey.agents.base import FlatParameters, flushing_denormals
from covey.networks import linear as linear_module
from covey.networks.distributions import (
    CategoricalHead,
    DiagGaussianHead,
    SquashedGaussianHead,
    SquashedStateDependentHead,
    StateDependentGaussianHead,
)
from covey.networks.mlp import ManualMLP, PairedMLP, mlp

mlp_module = importlib.import_module("covey.networks.mlp")  # covey.networks.mlp is also the function's name


def two_layers(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))


def loss_of(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return net(x).pow(2).sum() + net[0].weight.sum()


# ---------------------------------------------------------------------------- flat parameters
def test_parameters_become_views_of_one_buffer_with_unchanged_state_dict():
    net = two_layers()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    objects = list(net.parameters())
    flat = FlatParameters(objects)
    assert list(net.parameters()) == objects  # the same Parameter objects
    assert flat.data.numel() == sum(p.numel() for p in objects)
    for p in objects:
        assert p.untyped_storage().data_ptr() == flat.data.untyped_storage().data_ptr()
        assert p.grad.untyped_storage().data_ptr() == flat.grad.untyped_storage().data_ptr()
    after = net.state_dict()
    assert list(after) == list(before)
    assert all(after[k].shape == before[k].shape and torch.equal(after[k], before[k]) for k in before)
    with torch.no_grad():
        flat.data.add_(1.0)  # writing the buffer writes the parameters
    assert torch.equal(net[0].bias, before["0.bias"] + 1.0)


def test_backward_accumulates_into_the_flat_gradient():
    net, ref = two_layers(), two_layers()
    flat = FlatParameters(list(net.parameters()))
    x = torch.randn(4, 3)
    flat.zero_grad()
    loss_of(net, x).backward()
    loss_of(ref, x).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
    assert torch.allclose(flat.grad, expected)


def test_clip_grad_norm_matches_torch():
    net, ref = two_layers(), two_layers()
    flat = FlatParameters(list(net.parameters()))
    x = 10 * torch.randn(4, 3)
    loss_of(net, x).backward()
    loss_of(ref, x).backward()
    norm = flat.clip_grad_norm_(0.5)
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    assert norm > 0.5  # the example does clip
    assert torch.allclose(norm, ref_norm)
    for p, q in zip(net.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-7)
    # Below the limit nothing changes.
    before = flat.grad.clone()
    assert flat.clip_grad_norm_(100.0) < 100.0
    assert torch.equal(flat.grad, before)


@pytest.mark.parametrize("optimizer_class", [torch.optim.Adam, torch.optim.AdamW])
def test_flat_adam_steps_and_state_equal_per_parameter_adam(optimizer_class):
    """Adam over the flat buffer (direct fused kernel after the first step) equals Adam over the parameters,
    and its state dict has the per-parameter layout, keys and shapes."""
    net, ref = two_layers(), two_layers()
    flat = FlatParameters(list(net.parameters()))
    opt = flat.attach(optimizer_class([flat.data], lr=0.05, weight_decay=0.01, fused=True))
    ref_opt = optimizer_class(ref.parameters(), lr=0.05, weight_decay=0.01)
    for step in range(6):
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(step))
        flat.zero_grad()
        loss_of(net, x).backward()
        flat.clip_grad_norm_(1.0)
        flat.step(opt)
        ref_opt.zero_grad()
        loss_of(ref, x).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_opt.step()
    assert flat._direct is not None  # the later steps took the direct kernel
    for p, q in zip(net.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    ours, theirs = opt.state_dict(), ref_opt.state_dict()
    assert ours["param_groups"][0]["params"] == theirs["param_groups"][0]["params"] == [0, 1, 2, 3]
    assert set(ours["state"]) == set(theirs["state"])
    for i, entry in theirs["state"].items():
        assert set(ours["state"][i]) == set(entry)
        for key, value in entry.items():
            assert ours["state"][i][key].shape == value.shape
            assert torch.allclose(ours["state"][i][key].float(), value.float(), rtol=1e-5, atol=1e-8)


@pytest.fixture
def cpu_flushes_denormals():
    """Skips where this CPU cannot flush denormals; leaves the thread not flushing them afterwards."""
    supported = torch.set_flush_denormal(True)
    torch.set_flush_denormal(False)
    if not supported:
        pytest.skip("this CPU cannot flush denormal numbers to zero")
    yield
    torch.set_flush_denormal(False)


def test_flat_adam_step_flushes_denormal_momenta_and_restores_the_thread_setting(cpu_flushes_denormals):
    """Momenta that a zero gradient shrank into the denormal range become 0, everything else (parameters
    included) is exactly the plain fused kernel's; the thread's own setting is kept, on or off."""
    tiny = torch.finfo(torch.float32).tiny

    def denormal(t: torch.Tensor) -> torch.Tensor:
        return (t != 0) & (t.abs() < tiny)

    def adam_after(momentum: torch.Tensor, flat_step: bool) -> tuple[torch.Tensor, dict]:
        data = torch.linspace(-1.0, 1.0, 64)
        param = nn.Parameter(data.clone())
        flat = FlatParameters([param])
        opt = flat.attach(torch.optim.Adam([flat.data], lr=1e-3, fused=True))
        flat.grad.copy_(torch.linspace(0.5, 2.0, 64))
        flat.step(opt)  # creates the state
        opt.state[flat.data]["exp_avg"].copy_(momentum)
        flat.grad[:32] = 0.0  # dead units: their momenta only shrink
        for _ in range(3):
            if flat_step:
                flat.step(opt)
            else:
                torch.optim.Adam.step(opt)  # the optimizer's own step (attach's opt.step goes through flat.step)
        return flat.data.detach(), opt.state[flat.data]

    momentum = torch.full((64,), 0.01)
    momentum[:16] = 1.5e-38  # on the way down: denormal after the third step below
    momentum[16:32] = 5e-39  # denormal already
    assert flushing_denormals() is False
    plain_params, plain_state = adam_after(momentum, flat_step=False)
    assert denormal(plain_state["exp_avg"][:32]).all()  # what the plain step leaves
    params, state = adam_after(momentum, flat_step=True)
    assert flushing_denormals() is False  # restored
    assert torch.equal(state["exp_avg"][:32], torch.zeros(32))
    assert torch.equal(state["exp_avg"][32:], plain_state["exp_avg"][32:])
    assert torch.equal(state["exp_avg_sq"], plain_state["exp_avg_sq"])
    assert torch.equal(params, plain_params)  # the flushed momenta moved no parameter
    torch.set_flush_denormal(True)  # a process that flushes denormals itself keeps doing so
    adam_after(momentum, flat_step=True)
    assert flushing_denormals() is True


def test_direct_adam_step_leaves_optimizers_with_step_hooks_to_step():
    net = two_layers()
    flat = FlatParameters(list(net.parameters()))
    opt = flat.attach(torch.optim.Adam([flat.data], lr=0.05, fused=True))
    calls = []
    for step in range(3):
        if step == 2:
            opt.register_step_post_hook(lambda *_: calls.append(1))
        flat.zero_grad()
        loss_of(net, torch.randn(4, 3)).backward()
        flat.step(opt)
    assert calls == [1]  # the hook registered before the third step ran
    assert opt.state[flat.data]["step"] == 3


def test_flat_optimizer_loads_a_per_parameter_state_and_continues_identically():
    ref = two_layers()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.05)
    x = torch.randn(4, 3)
    for _ in range(3):
        ref_opt.zero_grad()
        loss_of(ref, x).backward()
        ref_opt.step()
    net = two_layers(seed=1)
    net.load_state_dict(ref.state_dict())
    flat = FlatParameters(list(net.parameters()))
    opt = flat.attach(torch.optim.Adam([flat.data], lr=0.05, fused=True))
    opt.load_state_dict(ref_opt.state_dict())
    for _ in range(2):
        flat.zero_grad()
        loss_of(net, x).backward()
        flat.step(opt)
        ref_opt.zero_grad()
        loss_of(ref, x).backward()
        ref_opt.step()
    for p, q in zip(net.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    with pytest.raises(ValueError, match="first group has 4"):
        opt.load_state_dict(torch.optim.Adam(nn.Linear(2, 2).parameters()).state_dict())


def test_a_scripts_steps_through_an_lr_scheduler_and_a_closure_are_the_per_parameter_optimizers():
    """``optimizer.zero_grad()`` (gradients set to None), a closure's backward, ``optimizer.step(closure)`` and an
    LR scheduler's wrapper of ``step``, on the optimizer ``attach`` made: the same steps as over the parameters."""
    net, ref = two_layers(), two_layers()
    initial = [p.detach().clone() for p in ref.parameters()]
    flat = FlatParameters(list(net.parameters()))
    opt = flat.attach(torch.optim.Adam([flat.data], lr=0.05, fused=True))
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.05)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5) for o in (opt, ref_opt)]
    x = torch.randn(4, 3)
    for _ in range(3):
        losses = []
        for o, n, scheduler in zip((opt, ref_opt), (net, ref), schedulers):

            def closure(o=o, n=n):
                o.zero_grad()
                loss = loss_of(n, x)
                loss.backward()
                return loss

            losses.append(o.step(closure))
            scheduler.step()
        torch.testing.assert_close(losses[0], losses[1])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 / 8)
    for p, q, start in zip(net.parameters(), ref.parameters(), initial):
        assert not torch.equal(q, start)
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_relink_restores_gradients_a_zero_grad_dropped_and_refuses_moved_parameters():
    net = two_layers()
    flat = FlatParameters(list(net.parameters()))
    net.zero_grad()  # sets every .grad to None
    assert net[0].weight.grad is None
    flat.relink()
    flat.zero_grad()
    loss_of(net, torch.randn(4, 3)).backward()
    assert flat.grad.abs().sum() > 0
    net[0].weight.data = net[0].weight.data.double()
    with pytest.raises(RuntimeError, match=r"replaced by one of shape \(5, 3\) \(torch.float64"):
        flat.relink()


@pytest.mark.parametrize("n_params", [1, 4])
def test_relink_takes_back_a_parameter_whose_data_was_replaced(n_params):
    """``p.data = new`` (what torch's vector_to_parameters does) leaves the buffer behind; relink copies the new
    values into the parameter's slice and makes it a view of the slice again, so an optimizer step over the
    buffer moves the new values."""
    net = two_layers()
    params = list(net.parameters())[:n_params]
    flat = FlatParameters(params)
    optimizer = flat.attach(torch.optim.SGD([flat.data], lr=0.5))
    address = params[-1].data_ptr()
    new = torch.full_like(params[-1], 3.0)
    params[-1].data = new.clone()
    flat.relink()
    assert params[-1].data_ptr() == address
    torch.testing.assert_close(flat.view(params[-1], flat.data), new, rtol=0, atol=0)
    flat.zero_grad()
    flat.view(params[-1]).fill_(1.0)
    flat.step(optimizer)
    torch.testing.assert_close(params[-1].detach(), new - 0.5, rtol=0, atol=0)


def test_polyak_update_of_flat_buffers_equals_per_parameter_lerp():
    online, target, ref = two_layers(0), two_layers(1), two_layers(1)
    online_flat = FlatParameters(list(online.parameters()))
    target_flat = FlatParameters(list(target.parameters()), with_grad=False)
    assert not target_flat.data.requires_grad and target[0].weight.grad is None
    with torch.no_grad():
        torch._foreach_lerp_([target_flat.data], [online_flat.data], 0.1)
        for t, o in zip(ref.parameters(), online.parameters()):
            t.lerp_(o, 0.1)
    for p, q in zip(target.parameters(), ref.parameters()):
        assert torch.allclose(p, q)


# ---------------------------------------------------------------------------- hand-differentiated networks
@pytest.fixture(params=["other CPUs", "Intel MKL"])
def kernel_forms(request, monkeypatch):
    """Both forms of the CPU-dependent kernel choices, whichever CPU runs the tests: tanh as
    ``2 * sigmoid(2x) - 1`` and transposed input gradients (other CPUs), or ``torch.tanh`` and direct
    products (Intel CPUs with MKL)."""
    other = request.param == "other CPUs"
    monkeypatch.setattr(mlp_module, "SIGMOID_TANH", other)
    monkeypatch.setattr(linear_module, "TRANSPOSED_INPUT_GRADS", other)
    return request.param


@pytest.mark.parametrize(
    ("hidden", "activation"),
    [([8, 6], nn.Tanh), ([8], nn.ReLU), ([], nn.Tanh), ([4, 4, 4], nn.ReLU), ([32, 20], nn.Tanh), ([20], nn.ReLU)],
)
def test_manual_mlp_equals_autograd(hidden, activation, kernel_forms):
    """Forward, acting and every weight and bias gradient equal autograd's; the wide first layers (3 inputs,
    at least 16 outputs) take the transposed weight-gradient product."""
    torch.manual_seed(0)
    trunk, out = mlp(3, hidden, activation), nn.Linear(hidden[-1] if hidden else 3, 2)
    params = [*trunk.parameters(), *out.parameters()]
    for p in params:
        p.grad = torch.zeros_like(p)
    manual = ManualMLP(trunk, out)
    assert (manual.narrow[0] is not None) == (bool(hidden) and hidden[0] >= 16)
    assert manual.sigmoid_tanh == (kernel_forms == "other CPUs")
    x = torch.randn(7, 3)
    grad_out = torch.randn(7, 2)
    y, inputs = manual.forward(x)
    expected = out(trunk(x))
    assert torch.allclose(y, expected, atol=1e-6)
    if not manual.sigmoid_tanh:  # the modules' own operations
        assert torch.equal(y, expected)
    assert torch.allclose(manual.infer(x), expected, atol=1e-6)
    manual.backward(inputs, grad_out)
    reference = torch.autograd.grad((expected * grad_out).sum(), params)
    for p, g in zip(params, reference):
        assert torch.allclose(p.grad, g, atol=1e-5)


@pytest.mark.skipif(not linear_module.AVAILABLE, reason="this PyTorch has no oneDNN linear op")
@pytest.mark.parametrize("activation", [nn.Tanh, nn.ReLU])
@pytest.mark.parametrize("first", [256, 64])  # 64 -> 256: the weight gradient transposes the layer's input
def test_manual_mlp_with_large_products_in_onednn_equals_autograd(monkeypatch, activation, first):
    """Wide layers on 64 samples: the middle layer's forward, weight and input gradients go to oneDNN."""
    monkeypatch.setattr(linear_module, "ONEDNN", True)
    torch.manual_seed(0)
    trunk, out = mlp(3, [first, 256], activation), nn.Linear(256, 2)
    params = [*trunk.parameters(), *out.parameters()]
    for p in params:
        p.grad = torch.zeros_like(p)
    manual = ManualMLP(trunk, out)
    assert manual._plan(64) == [False, True, False]  # per layer: its products in oneDNN
    x, grad_out = torch.randn(64, 3), torch.randn(64, 2)
    y, inputs = manual.forward(x)
    expected = out(trunk(x))
    assert torch.allclose(y, expected, atol=1e-5)
    manual.backward(inputs, grad_out)
    reference = torch.autograd.grad((expected * grad_out).sum(), params)
    for p, g in zip(params, reference):
        assert torch.allclose(p.grad, g, rtol=1e-4, atol=1e-4 * g.abs().max().item())


@pytest.mark.parametrize("onednn", [False, True])
@pytest.mark.parametrize("activation", [nn.Tanh, nn.ReLU])
def test_manual_mlp_input_gradient_and_one_output_head_equal_autograd(monkeypatch, onednn, activation, kernel_forms):
    """A critic-shaped network (4 inputs, one output): the weight gradients (the output layer's input
    gradient is an outer product) and, without touching them, the gradient of the input's last columns."""
    monkeypatch.setattr(linear_module, "ONEDNN", onednn and linear_module.AVAILABLE)
    torch.manual_seed(0)
    trunk, out = mlp(4, [64, 256], activation), nn.Linear(256, 1)
    params = [*trunk.parameters(), *out.parameters()]
    for p in params:
        p.grad = torch.zeros_like(p)
    manual = ManualMLP(trunk, out)
    assert manual._plan(64) == [False, onednn and linear_module.AVAILABLE, False]
    x = torch.randn(64, 4, requires_grad=True)
    grad_out = torch.randn(64, 1)
    expected = out(trunk(x))
    *reference, grad_x = torch.autograd.grad((expected * grad_out).sum(), [*params, x])
    with torch.no_grad():
        y, inputs = manual.forward(x.detach())
        assert torch.allclose(y, expected, atol=1e-5)
        grad_action = manual.input_grad(inputs, grad_out, start=3)
        assert all(not p.grad.any() for p in params)  # the weights' gradients are left alone
        assert torch.allclose(grad_action, grad_x[:, 3:], atol=1e-5)
        assert torch.allclose(manual.input_grad(inputs, grad_out), grad_x, atol=1e-5)
        manual.backward(inputs, grad_out)
    for p, g in zip(params, reference):
        assert torch.allclose(p.grad, g, rtol=1e-4, atol=1e-4 * g.abs().max().item())


def actor_and_critic(n_in: int, hidden: list, activation, outs: tuple, order: str = "a, b"):
    """Two ManualMLPs of the same trunk shape and output widths ``outs``, their parameters in one flat buffer
    (``order``: whose come first), and each one's parameters."""
    torch.manual_seed(0)
    nets = [(mlp(n_in, hidden, activation), nn.Linear(hidden[-1] if hidden else n_in, n)) for n in outs]
    params = [[*trunk.parameters(), *out.parameters()] for trunk, out in nets]
    FlatParameters(params[0] + params[1] if order == "a, b" else params[1] + params[0])
    return [ManualMLP(trunk, out) for trunk, out in nets], params


@pytest.mark.parametrize("rows", [5, 64])
@pytest.mark.parametrize(
    ("n_in", "hidden", "activation", "outs"),
    [
        (3, [8, 6], nn.Tanh, (2, 1)),
        (3, [32, 20], nn.Tanh, (3, 1)),  # a wide first layer on 3 inputs: transposed weight gradients
        (20, [16], nn.ReLU, (1, 1)),  # one output each: outer products for the input gradients
        (4, [64, 64], nn.ReLU, (2, 1)),
    ],
)
def test_paired_mlp_equals_each_network_alone(n_in, hidden, activation, outs, rows, kernel_forms):
    """The paired trunks give each network's outputs, and write each network's weight and bias gradients
    into its own slice of the flat buffer, as the networks run one at a time do (to float rounding)."""
    (a, b), params = actor_and_critic(n_in, hidden, activation, outs)
    pair = PairedMLP.of(a, b)
    assert pair is not None
    assert (pair.narrow[0] is not None) == (hidden[0] >= 16 and n_in < 16)
    x = torch.randn(rows, n_in)
    grad_a, grad_b = torch.randn(rows, outs[0]), torch.randn(rows, outs[1])
    out_a, saved_a = a.forward(x)
    out_b, saved_b = b.forward(x)
    a.backward(saved_a, grad_a)
    b.backward(saved_b, grad_b)
    alone = [p.grad.clone() for p in params[0] + params[1]]
    for p in params[0] + params[1]:
        p.grad.fill_(float("nan"))  # every gradient must be written again
    paired_a, paired_b, saved = pair.forward(x)
    pair.backward(saved, grad_a, grad_b)
    assert torch.allclose(paired_a, out_a, atol=1e-6) and torch.allclose(paired_b, out_b, atol=1e-6)
    for p, g in zip(params[0] + params[1], alone):
        assert torch.allclose(p.grad, g, atol=1e-6)


def test_paired_mlp_refuses_networks_it_cannot_run_as_one(monkeypatch):
    """Other hidden layers, activations, no hidden layer, parameters outside one buffer or the second network's
    before the first's, networks off the CPU, a large layer in oneDNN or bfloat16, and the switch off: no
    pairing."""
    assert PairedMLP.of(*actor_and_critic(4, [8, 8], nn.Tanh, (2, 1))[0]) is not None
    a, b = actor_and_critic(4, [8, 8], nn.Tanh, (2, 1), order="b, a")[0]
    assert PairedMLP.of(a, b) is None and PairedMLP.of(b, a) is not None
    torch.manual_seed(0)
    nets = [
        (mlp(4, hidden, act), nn.Linear(hidden[-1] if hidden else 4, 1))
        for hidden, act in [([8, 8], nn.Tanh), ([8, 6], nn.Tanh), ([8, 8], nn.ReLU), ([], nn.Tanh), ([8, 8], nn.Tanh)]
    ]
    FlatParameters([p for trunk, out in nets[:4] for p in [*trunk.parameters(), *out.parameters()]])
    first, other_width, other_activation, no_hidden, outside = (ManualMLP(trunk, out) for trunk, out in nets)
    for second in (other_width, other_activation, outside):
        assert PairedMLP.of(first, second) is None
    assert PairedMLP.of(no_hidden, no_hidden) is None
    a, b = actor_and_critic(4, [8, 8], nn.Tanh, (2, 1))[0]
    on_cpu = a.weights
    a.weights = [w.to("meta") for w in on_cpu]  # off the CPU (where pairing was measured): one at a time
    assert PairedMLP.of(a, b) is None
    a.weights = on_cpu
    monkeypatch.setattr(mlp_module, "PAIR_TRUNKS", False)
    assert PairedMLP.of(a, b) is None
    monkeypatch.setattr(mlp_module, "PAIR_TRUNKS", True)
    a.bf16 = True
    assert PairedMLP.of(a, b) is None
    wide = actor_and_critic(4, [64, 128], nn.Tanh, (2, 1))[0]  # 64 x 128 weights: oneDNN's size
    monkeypatch.setattr(linear_module, "ONEDNN", True)
    for net in wide:
        net.bind()
    assert PairedMLP.of(*wide) is None
    monkeypatch.setattr(linear_module, "ONEDNN", False)
    for net in wide:
        net.bind()
    assert PairedMLP.of(*wide) is not None


def bf16_reference(trunk: nn.Sequential, out: nn.Linear, x: torch.Tensor, large: list[bool]) -> torch.Tensor:
    """The network through autograd, the ``large`` layers' products rounded as :class:`ManualMLP` with
    ``bf16=True`` rounds them: inputs and weights to bfloat16, the product in bfloat16, the bias in float32."""
    layers = [*list(trunk)[0::2], out]
    activations = list(trunk)[1::2]
    h = x
    for i, (layer, is_large) in enumerate(zip(layers, large)):
        if is_large:
            h = torch.add(torch.mm(h.to(torch.bfloat16), layer.weight.to(torch.bfloat16).t()), layer.bias)
        else:
            h = layer(h)
        if i < len(activations):
            h = activations[i](h)
    return h


@pytest.mark.parametrize("activation", [nn.Tanh, nn.ReLU])
def test_manual_mlp_with_bfloat16_products_equals_its_autograd_reference(monkeypatch, activation):
    """``bf16=True``: the middle 256x256 layer multiplies in bfloat16 (the small first and last layers in
    float32), forward, weight and input gradients alike, whether or not oneDNN is switched on; the results
    are not float32's, but within bfloat16's rounding of them."""
    torch.manual_seed(0)
    trunk, out = mlp(4, [256, 256], activation), nn.Linear(256, 1)
    params = [*trunk.parameters(), *out.parameters()]
    x = torch.randn(64, 4, requires_grad=True)
    grad_out = torch.randn(64, 1)
    expected = bf16_reference(trunk, out, x, [False, True, False])
    *reference, grad_x = torch.autograd.grad((expected * grad_out).sum(), [*params, x])
    plain = out(trunk(x))
    *fp32_grads, _ = torch.autograd.grad((plain * grad_out).sum(), [*params, x])
    for onednn in (False, True):
        monkeypatch.setattr(linear_module, "ONEDNN", onednn and linear_module.AVAILABLE)
        for p in params:
            p.grad = torch.zeros_like(p)
        manual = ManualMLP(trunk, out, bf16=True)
        assert manual._plan(64) == [False, True, False]
        with torch.no_grad():
            y, inputs = manual.forward(x.detach())
            assert y.dtype == torch.float32
            assert torch.allclose(y, expected, atol=1e-5)
            assert not torch.allclose(y, plain, atol=1e-6)  # bfloat16 did run
            assert torch.allclose(y, plain, rtol=0.02, atol=0.02 * plain.abs().max().item())
            assert torch.allclose(manual.input_grad(inputs, grad_out), grad_x, atol=1e-5)
            manual.backward(inputs, grad_out)
        for p, g, g32 in zip(params, reference, fp32_grads):
            assert p.grad.dtype == torch.float32
            assert torch.allclose(p.grad, g, rtol=1e-4, atol=1e-4 * g.abs().max().item())
            # against float32 as a whole: a ReLU input rounded across 0 changes single entries entirely
            assert (p.grad - g32).norm() <= 0.05 * g32.norm()
    # Small batches keep every product in float32: the result is float32's.
    manual = ManualMLP(trunk, out, bf16=True)
    assert manual._plan(8) == [False, False, False]
    with torch.no_grad():
        assert torch.allclose(manual.forward(x[:8].detach())[0], plain[:8], atol=1e-5)


def test_manual_mlp_holds_bfloat16_weights_until_released():
    """``hold_weights16``: the products multiply with one bfloat16 copy of each large layer's weights, the same
    numbers as rounding them per product, until the weights are held again or released; backward reuses the
    bfloat16 inputs that forward made and gives the gradients of a plain list of inputs (rounded anew)."""
    torch.manual_seed(0)
    trunk, out = mlp(4, [256, 256], nn.ReLU), nn.Linear(256, 1)
    params = [*trunk.parameters(), *out.parameters()]
    for p in params:
        p.grad = torch.zeros_like(p)
    manual = ManualMLP(trunk, out, bf16=True)
    x, grad_out = torch.randn(64, 4), torch.randn(64, 1)
    with torch.no_grad():
        fresh, _ = manual.forward(x)
        manual.hold_weights16()
        held, inputs = manual.forward(x)
        assert torch.equal(held, fresh)
        assert list(inputs.bf16) == [1] and torch.equal(inputs.bf16[1], inputs[1].to(torch.bfloat16))
        manual.backward(inputs, grad_out)
        grads = [p.grad.clone() for p in params]
        manual.backward(list(inputs), grad_out)  # no bfloat16 copies kept: each is made again
        assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))
        assert torch.equal(manual.input_grad(inputs, grad_out, start=2), manual.input_grad(list(inputs), grad_out, 2))
        trunk[2].weight.add_(0.5)  # the large layer's weights change
        stale, _ = manual.forward(x)
        assert torch.equal(stale, held)  # the held copy is what multiplies
        manual.hold_weights16()
        renewed, _ = manual.forward(x)
        manual.release_weights16()
        unheld, _ = manual.forward(x)
    assert not torch.equal(renewed, held) and torch.equal(renewed, unheld)
    assert torch.allclose(unheld, bf16_reference(trunk, out, x, [False, True, False]), atol=1e-5)


def test_sac_bf16_steps_with_held_weights_equal_rounding_per_product():
    """ManualSACStep holds each network's bfloat16 weights for a step and the critics' again after their optimizer
    step: the parameters after several steps are those of rounding every weight per product, to the bit (a
    critic copy held across its update would make the actor's loss read the old critic)."""
    models = []
    for hold in (True, False):
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=100, batch_size=64, seed=0, bf16_matmuls=True)
        model.learn(120)
        nets = [model._manual.actor_net, *model._manual.critic_nets, *model._manual.target_nets]
        assert all(net._plan(64) == [False, True, False] for net in nets)
        if not hold:
            for net in nets:
                net.hold_weights16 = net.release_weights16
        torch.manual_seed(3)
        model.train(5, 64)
        models.append(model)
    for name in ("actor", "critic", "critic_target"):
        for p, q in zip(getattr(models[0], name).parameters(), getattr(models[1], name).parameters()):
            assert torch.equal(p, q), name
    assert all(net._weights16 is None for net in [models[0]._manual.actor_net, *models[0]._manual.critic_nets])


def test_manual_mlp_refuses_unsupported_layers():
    assert not ManualMLP.supports(mlp(3, [4], nn.ELU), nn.Linear(4, 1))
    with pytest.raises(ValueError, match="Tanh or ReLU"):
        ManualMLP(nn.Sequential(nn.Linear(3, 4), nn.ELU()), nn.Linear(4, 1))


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
def test_action_head_terms_and_gradients_equal_autograd(kind):
    torch.manual_seed(0)
    if kind == "categorical":
        head = CategoricalHead(4, 3, start=2)
        actions = torch.tensor([2, 4, 3, 2, 4])
    else:
        head = DiagGaussianHead(4, 2, log_std_init=-0.3)
        actions = torch.randn(5, 2)
        head.log_std.grad = torch.zeros_like(head.log_std)
    params = torch.randn(5, head.proj.out_features, requires_grad=True)
    log_prob, entropy = head.log_prob(params, actions), head.entropy(params)
    weights = torch.randn(5)
    loss = (weights * log_prob).sum() - 0.3 * entropy.sum()
    grads = torch.autograd.grad(loss, [params, *([head.log_std] if kind == "gaussian" else [])])
    with torch.no_grad():
        m_log_prob, m_entropy, terms = head.manual_terms(params.detach(), head.manual_actions(actions))
        m_grad = head.manual_grad(terms, weights, -0.3)
    assert torch.allclose(m_log_prob, log_prob, atol=1e-5)
    assert torch.allclose(m_entropy, entropy, atol=1e-5)
    assert torch.allclose(m_grad, grads[0], atol=1e-5)
    if kind == "gaussian":
        assert torch.allclose(head.log_std.grad, grads[1], atol=1e-5)


def test_squashed_gaussian_sample_and_gradients_equal_autograd():
    """The reparameterized sample, its log-probability and d(loss)/d(params) through both, with some
    log-stds beyond the clip, two at its bounds (no gradient at either: hardtanh's, on every PyTorch) and two just
    inside them (a gradient)."""
    head = SquashedGaussianHead(4, 2)
    torch.manual_seed(0)
    params = torch.randn(6, 4)
    params[0, 2], params[1, 3], params[2, 2], params[3, 3] = 3.0, -25.0, 2.0, -20.0
    params[4, 2], params[5, 3] = 1.99, -19.99
    params.requires_grad_(True)
    weights_action, weights_log_prob = torch.randn(6, 2), torch.randn(6)
    torch.manual_seed(1)
    action, log_prob = head.rsample(params)
    loss = (weights_action * action).sum() + (weights_log_prob * log_prob).sum()
    (expected,) = torch.autograd.grad(loss, [params])
    torch.manual_seed(1)
    with torch.no_grad():
        m_action, m_log_prob, terms = head.manual_rsample(params.detach())
        grad = head.manual_grad(terms, weights_action, weights_log_prob)
    assert torch.equal(m_action, action) and torch.equal(m_log_prob, log_prob)
    assert torch.allclose(grad, expected, atol=1e-5)
    assert grad[0, 2] == 0 and grad[1, 3] == 0 and grad[2, 2] == 0 and grad[3, 3] == 0
    assert grad[4, 2] != 0 and grad[5, 3] != 0


@pytest.mark.parametrize(
    "settings",
    [dict(), dict(full_std=False, use_expln=True)],
    ids=["PPO's defaults", "one std per feature, expln"],
)
def test_state_dependent_terms_and_gradients_equal_autograd(settings):
    """PPO's gSDE head (``use_sde=True``), by hand: log-probabilities and entropies from the means and the
    latent, d(loss)/d(mean) and d(loss)/d(log_std) (through the variance, the latent entering it detached)
    as autograd has them, for log-stds on both sides of 0. In float64."""
    torch.manual_seed(0)
    head = StateDependentGaussianHead(5, 2, **settings).double()
    with torch.no_grad():
        head.log_std.copy_(torch.linspace(-1.5, 0.5, head.log_std.numel()).view_as(head.log_std))
    head.log_std.grad = torch.zeros_like(head.log_std)
    mean = torch.randn(7, 2, dtype=torch.float64, requires_grad=True)
    latent = torch.randn(7, 5, dtype=torch.float64) * 0.5
    actions = torch.randn(7, 2, dtype=torch.float64)
    weights = torch.randn(7, dtype=torch.float64)
    params = torch.cat([mean, latent], dim=-1)
    log_prob, entropy = head.log_prob(params, actions), head.entropy(params)
    loss = (weights * log_prob).sum() - 0.3 * entropy.sum()
    expected = torch.autograd.grad(loss, [mean, head.log_std])
    with torch.no_grad():
        m_log_prob, m_entropy, terms = head.manual_terms(mean.detach(), head.manual_actions(actions), latent)
        grad_mean = head.manual_grad(terms, weights, -0.3)
    assert torch.allclose(m_log_prob, log_prob, rtol=1e-12, atol=1e-12)
    assert torch.allclose(m_entropy, entropy, rtol=1e-12, atol=1e-12)
    assert torch.allclose(grad_mean, expected[0], rtol=1e-9, atol=1e-9)
    assert torch.allclose(head.log_std.grad, expected[1], rtol=1e-9, atol=1e-9)
    assert head.log_std.grad.abs().min() > 0 and grad_mean.abs().min() > 0


@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(full_std=False, use_expln=True, clip_mean=0.0),
        dict(full_std=True, use_expln=True, clip_mean=0.5),
    ],
    ids=["SAC's defaults", "one std per feature, expln, no clip", "expln, clip 0.5"],
)
def test_squashed_state_dependent_sample_and_gradients_equal_autograd(settings):
    """gSDE's squashed sample for SAC (``use_sde=True``), by hand: the action and log-probability of
    ``rsample``, and d(loss)/d(mean layer's output), d(loss)/d(latent) (through the mean layer's caller, the
    noise and the variance) and d(loss)/d(log_std) (through the exploration matrix and the variance), as
    autograd has them; means beyond the clip get no gradient, and log-stds on both sides of 0 (expln's two
    branches) get theirs. In float64, so that float32's rounding of terms that cancel does not hide errors."""
    torch.manual_seed(0)
    head = SquashedStateDependentHead(5, 2, log_std_init=-1.0, **settings).double()
    with torch.no_grad():
        head.log_std.copy_(torch.linspace(-1.5, 0.5, head.log_std.numel()).view_as(head.log_std))  # both sides of 0
    head.log_std.grad = torch.zeros_like(head.log_std)
    raw_mean = torch.randn(7, 2, dtype=torch.float64) * 0.4
    raw_mean[0, 0], raw_mean[1, 1] = 5.0, -5.0  # beyond any clip used here
    latent = torch.randn(7, 5, dtype=torch.float64) * 0.3
    weights_action, weights_log_prob = torch.randn(7, 2, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    head.reset_noise(differentiable=True)  # E = std * N(0, 1), with a graph to log_std
    raw_mean.requires_grad_(True)
    latent.requires_grad_(True)
    clip = head.clip_mean
    mean = torch.nn.functional.hardtanh(raw_mean, -clip, clip) if clip > 0 else raw_mean
    action, log_prob = head.rsample(torch.cat([mean, latent], dim=-1))
    loss = (weights_action * action).sum() + (weights_log_prob * log_prob).sum()
    expected = torch.autograd.grad(loss, [raw_mean, latent, head.log_std])
    with torch.no_grad():
        m_action, m_log_prob, terms = head.manual_rsample(raw_mean.detach(), latent.detach())
        grad_mean, grad_latent = head.manual_grad(terms, weights_action, weights_log_prob)
    assert torch.allclose(m_action, action, rtol=1e-12, atol=1e-12)
    assert torch.allclose(m_log_prob, log_prob, rtol=1e-12, atol=1e-12)
    for grad, reference in zip((grad_mean, grad_latent, head.log_std.grad), expected):
        assert torch.allclose(grad, reference, rtol=1e-9, atol=1e-9)
    assert head.log_std.grad.abs().min() > 0 and grad_latent.abs().min() > 0
    inside = raw_mean.detach().abs() < clip if clip > 0 else torch.ones_like(raw_mean, dtype=torch.bool)
    assert torch.equal(grad_mean != 0, inside)
    assert inside.sum() >= 10


def test_categorical_samples_follow_the_softmax():
    head = CategoricalHead(1, 3, start=1)
    logits = torch.tensor([[0.0, 1.0, 2.0]]).expand(30_000, 3)
    torch.manual_seed(0)
    counts = torch.bincount(head.sample(logits) - 1, minlength=3).float() / 30_000
    assert torch.allclose(counts, logits[0].softmax(-1), atol=0.01)
    assert torch.equal(head.sample(logits[:2], deterministic=True), torch.tensor([3, 3]))


# ---------------------------------------------------------------------------- PPO: acting in NumPy
@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("CartPole-v1", {}),
        ("Pendulum-v1", {}),
        ("CartPole-v1", dict(policy_kwargs=dict(activation_fn=nn.ReLU))),
        ("Pendulum-v1", dict(policy_kwargs=dict(normalize_observations=True))),
    ],
)
@pytest.mark.cpu
def test_numpy_acting_equals_the_actor_and_follows_its_updates(env_id, kwargs):
    """The NumPy forward reads the live weights (and running statistics of the observations): after updates it
    still equals the actor's own forward."""
    model = PPO("MlpPolicy", env_id, n_steps=64, batch_size=32, seed=0, **kwargs)
    acting = model._numpy_acting
    assert acting is not None
    before = acting.forward(np.ones((1, *model.observation_space.shape), np.float32)).copy()
    model.learn(256)
    obs = np.random.default_rng(0).normal(size=(9, *model.observation_space.shape)).astype(np.float32)
    with torch.no_grad():
        expected = model.actor.distribution_params(torch.as_tensor(obs)).numpy()
    assert np.allclose(acting.forward(obs), expected, atol=1e-5)
    assert not np.allclose(acting.forward(np.ones_like(obs[:1])), before)  # the weights did move
    assert np.allclose(acting.forward(obs.astype(np.float64)), expected, atol=1e-5)  # float64 observations


@pytest.mark.cpu
def test_numpy_acting_samples_follow_the_policy():
    """Discrete: action frequencies are the softmax of the logits (Gumbel-max); Box: mean + std * N(0, 1)."""
    np.random.seed(0)
    model = PPO("MlpPolicy", "CartPole-v1", seed=0)
    obs = np.repeat(np.array([[0.1, -0.2, 0.05, 0.3]], np.float32), 30_000, axis=0)
    actions = model._numpy_acting.act(obs)
    assert actions.dtype == np.int64 and actions.shape == (30_000,)
    logits = torch.as_tensor(model._numpy_acting.forward(obs[:1]))[0]
    counts = np.bincount(actions, minlength=2) / 30_000
    assert np.allclose(counts, logits.softmax(-1).numpy(), atol=0.01)
    model = PPO("MlpPolicy", "Pendulum-v1", seed=0)
    with torch.no_grad():
        model.actor.head.log_std.fill_(-1.0)
    obs = np.repeat(np.array([[0.5, -0.5, 0.2]], np.float32), 30_000, axis=0)
    actions = model._numpy_acting.act(obs)
    assert actions.dtype == np.float32 and actions.shape == (30_000, 1)
    mean = model._numpy_acting.forward(obs[:1])[0]
    assert abs(actions.mean() - mean[0]) < 0.01 and abs(actions.std() - np.exp(-1.0)) < 0.01


def ppo_test_env(env_id: str):
    """The envs the tests below name ("image", "discrete observations", "multidiscrete"), or a Gymnasium id."""
    if env_id == "image":
        return SpaceEnv(image_space((36, 36, 1)), spaces.Discrete(2))
    if env_id == "discrete observations":
        return SpaceEnv(spaces.Discrete(5), spaces.Discrete(2))
    if env_id == "multidiscrete":
        return SpaceEnv(spaces.Box(-1, 1, (2,), np.float32), spaces.MultiDiscrete([2, 3]))
    return env_id


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(env_id="discrete observations"),
        dict(policy="CnnPolicy", env_id="image"),
        dict(policy="MlpLstmPolicy"),
        dict(policy_kwargs=dict(value_head="twohot")),
    ],
)
def test_numpy_acting_applies_only_with_the_manual_update_and_a_flatten_encoder(kwargs):
    kwargs = dict(kwargs)
    env = ppo_test_env(kwargs.pop("env_id", "CartPole-v1"))
    model = PPO(kwargs.pop("policy", "MlpPolicy"), env, n_steps=16, batch_size=16, seed=0, **kwargs)
    assert model._numpy_acting is None
    before = [p.detach().clone() for p in model.actor.parameters()]
    model.learn(32)
    assert any(not torch.equal(p, q) for p, q in zip(model.actor.parameters(), before))


@pytest.mark.cpu
def test_numpy_acting_with_gsde_gives_the_modules_actions_without_drawing():
    """``use_sde=True``: NumPy acting adds ``latent @ E`` from the exploration matrices drawn in PyTorch (one per
    env for a batch of every env, the single one otherwise), as ``Actor.act`` does, and draws nothing from
    NumPy's generator; a new draw of the matrices changes the actions."""
    model = PPO("MlpPolicy", make_vec_env("Pendulum-v1", 3, seed=0), n_steps=16, batch_size=16, use_sde=True, seed=0)
    assert model._manual is not None and model._numpy_acting is not None
    head = model.actor.head
    head.reset_noise(3)
    obs = np.random.default_rng(1).standard_normal((3, 3)).astype(np.float32)
    for rows in (obs, obs[:1], obs[:2]):
        state = np.random.get_state()
        actions = model._numpy_acting.act(rows)
        assert np.array_equal(np.random.get_state()[1], state[1])
        with torch.no_grad():
            expected = model.actor.act(torch.as_tensor(rows)).numpy()
        assert actions.shape == expected.shape and np.allclose(actions, expected, atol=1e-5)
    mean = model._numpy_acting.forward(obs)
    assert np.abs(model._numpy_acting.act(obs) - mean).min() > 0  # the noise is there, per row
    before = model._numpy_acting.act(obs)
    head.reset_noise(3)
    assert not np.allclose(model._numpy_acting.act(obs), before)
    model.learn(32)  # collecting and training with it


@pytest.mark.cpu
def test_numpy_acting_can_be_switched_off(monkeypatch):
    """``PPO.numpy_acting = False``: acting in PyTorch, with PyTorch's random generator."""
    actions = {}
    for switch in (True, False):
        monkeypatch.setattr(PPO, "numpy_acting", switch)
        for torch_seed in (0, 1):
            model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0)
            assert (model._numpy_acting is not None) == switch and model._manual is not None
            np.random.seed(0)
            torch.manual_seed(torch_seed)
            model.learn(32)
            actions[switch, torch_seed] = model.rollout_buffer.actions_tensor.clone()
    # NumPy's generator draws NumPy acting's actions, PyTorch's those of acting in PyTorch.
    assert torch.equal(actions[True, 0], actions[True, 1])
    assert not torch.equal(actions[False, 0], actions[False, 1])


# ---------------------------------------------------------------------------- PPO: hand-written update vs autograd
class Recorder(Logger):
    """A logger that keeps the last value of every key."""

    def __init__(self):
        super().__init__(None, [])
        self.values = {}

    def record(self, key, value, exclude=None):
        self.values[key] = value

    def dump(self, step=0):
        pass


def one_update(monkeypatch, manual: bool, env_id: str, **kwargs):
    monkeypatch.setattr(PPO, "manual_gradients", manual)
    monkeypatch.setattr(PPO, "numpy_acting", False)  # both act in PyTorch: the same rollout
    model = PPO("MlpPolicy", make_vec_env(env_id, n_envs=2, seed=0), n_steps=64, seed=0, **kwargs)
    assert (model._manual is not None) == manual
    recorder = Recorder()
    model.set_logger(recorder)
    _, callback = model._setup_learn(10_000, None, True, "test", False)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    torch.manual_seed(123)  # the same minibatch permutations for both
    model.train()
    return model, recorder.values


CASES = {
    "discrete, entropy bonus, clipping": ("CartPole-v1", dict(batch_size=32, learning_rate=0.01, ent_coef=0.01)),
    "box, clipping": ("Pendulum-v1", dict(batch_size=32, learning_rate=0.01, n_epochs=4, ent_coef=0.02)),
    "truncated last minibatch": ("CartPole-v1", dict(batch_size=48, n_epochs=3)),
    "one minibatch, raw advantages": ("CartPole-v1", dict(batch_size=128, normalize_advantage=False)),
    "early stop on target_kl": ("CartPole-v1", dict(batch_size=32, learning_rate=0.01, target_kl=0.002)),
    "relu, other widths": (
        "CartPole-v1",
        dict(batch_size=64, policy_kwargs=dict(activation_fn=nn.ReLU, net_arch=dict(pi=[32], vf=[16, 16]))),
    ),
    "gSDE, clipping, entropy bonus": (
        "Pendulum-v1",
        dict(batch_size=32, learning_rate=0.01, n_epochs=4, ent_coef=0.02, use_sde=True, sde_sample_freq=4),
    ),
    "gSDE, expln, one std per feature": (
        "Pendulum-v1",
        dict(batch_size=32, use_sde=True, policy_kwargs=dict(use_expln=True, full_std=False, log_std_init=0.5)),
    ),
}


@pytest.mark.filterwarnings("ignore:batch_size=48 does not divide")
@pytest.mark.parametrize("case", list(CASES))
def test_manual_ppo_update_equals_autograd_update(monkeypatch, case, kernel_forms):
    """Same parameters after one update (epochs of minibatches), same logged statistics, same epoch count."""
    env_id, kwargs = CASES[case]
    ours, ours_log = one_update(monkeypatch, True, env_id, **kwargs)
    ref, ref_log = one_update(monkeypatch, False, env_id, **kwargs)
    # the trunks run paired (PairedMLP) unless gSDE's head reads the latent or the trunks differ
    assert (ours._manual.pair is not None) == ("gSDE" not in case and "other widths" not in case)
    moved = max((p - q).abs().max().item() for p, q in zip(ours._params, ref._params))
    assert moved < 1e-5
    assert ours._n_updates == ref._n_updates
    for key, value in ref_log.items():
        if key.startswith("train/") and isinstance(value, float):
            assert ours_log[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    if case == "early stop on target_kl":
        assert ours._n_updates < ours.n_epochs
    if "clipping" in case:
        assert ours_log["train/clip_fraction"] > 0


@pytest.mark.filterwarnings("ignore:batch_size=48 does not divide")
@pytest.mark.parametrize("case", ["discrete, entropy bonus, clipping", "box, clipping", "truncated last minibatch"])
def test_manual_ppo_update_with_paired_trunks_equals_one_network_at_a_time(monkeypatch, case):
    """With the trunks paired and with them one at a time (``PAIR_TRUNKS``), the rollout's values and log-probs
    and one update's parameters and statistics agree to float rounding."""
    env_id, kwargs = CASES[case]
    runs = {}
    for paired in (True, False):
        monkeypatch.setattr(mlp_module, "PAIR_TRUNKS", paired)
        runs[paired] = one_update(monkeypatch, True, env_id, **kwargs)
        assert (runs[paired][0]._manual.pair is not None) == paired
    (ours, ours_log), (ref, ref_log) = runs[True], runs[False]
    for name in ("values_tensor", "log_probs_tensor"):
        expected = getattr(ref.rollout_buffer, name)
        assert torch.allclose(getattr(ours.rollout_buffer, name), expected, atol=1e-6), name
    assert max((p - q).abs().max().item() for p, q in zip(ours._params, ref._params)) < 1e-6
    for key, value in ref_log.items():
        if key.startswith("train/") and isinstance(value, float):
            assert ours_log[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_ppo_keeps_training_with_paired_trunks_after_a_users_zero_grad():
    """A user's ``zero_grad()`` between ``learn`` calls sets every gradient to None: the next rollout and update
    run (paired again, the gradients back in the flat buffer) and move the parameters."""
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, seed=0).learn(64)
    assert model._manual.pair is not None
    model.policy.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model._params)
    before = [p.detach().clone() for p in model._params]
    model.learn(64, reset_num_timesteps=False)
    assert model._manual.pair is not None
    flat = model.optimizer.flat_parameters
    assert all(p.grad is not None and p.grad.data_ptr() == flat.view(p).data_ptr() for p in model._params)
    assert all(not torch.equal(p, q) for p, q in zip(model._params, before))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(policy="CnnPolicy", env_id="image"),
        dict(clip_range_vf=0.2),
        dict(policy_kwargs=dict(value_head="twohot")),
        dict(policy_kwargs=dict(critic_ema_decay=0.9)),
        dict(policy="MlpLstmPolicy"),
        dict(env_id="multidiscrete"),
        dict(policy_kwargs=dict(activation_fn=nn.ELU)),
    ],
)
def test_ppo_falls_back_to_autograd_outside_the_manual_path(kwargs):
    kwargs = dict(kwargs)
    env = ppo_test_env(kwargs.pop("env_id", "CartPole-v1"))
    model = PPO(kwargs.pop("policy", "MlpPolicy"), env, n_steps=16, batch_size=16, seed=0, **kwargs)
    assert model._manual is None
    model.learn(32)


@pytest.mark.parametrize("net_arch", [[64, 64], [256, 256]])
def test_rollout_is_evaluated_with_the_update_arithmetic(monkeypatch, net_arch):
    """Old log-probs and values come from the same arithmetic as the update: the minibatches' ratios start
    exactly at 1 (with 256-wide layers in oneDNN too, evaluated on 1024 rows, updated on 64); and they agree
    with the modules to float rounding. (On the CPU: GPU kernels may round a batch's rows and its parts'
    differently.)"""
    monkeypatch.setattr(linear_module, "ONEDNN", linear_module.AVAILABLE)
    model = PPO(
        "MlpPolicy",
        "CartPole-v1",
        n_steps=1024,
        batch_size=64,
        seed=0,
        device="cpu",
        policy_kwargs=dict(net_arch=net_arch),
    )
    assert model._manual is not None
    _, callback = model._setup_learn(1024, None, True, "test", False)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    buffer = model.rollout_buffer
    obs, actions = buffer.flat_observations(), buffer.flat_actions()
    manual = model._manual
    # 64-wide trunks run paired (PairedMLP), 256-wide ones in oneDNN one at a time (where PyTorch has it)
    assert (manual.pair is not None) == (net_arch == [64, 64] or not linear_module.AVAILABLE)
    with torch.no_grad():
        x = model.actor.encoder(obs[100:164])  # the update's minibatch of 64 rows, as it computes it
        logits, values, saved = manual._forward(x, x)
        log_prob = manual._terms(logits, model.actor.head.manual_actions(actions[100:164]), saved)[0]
        assert torch.equal(log_prob, buffer.log_probs_tensor.reshape(-1)[100:164])
        assert torch.equal(values.view(-1), buffer.values_tensor.reshape(-1)[100:164])
        logits, _ = manual.policy_net.forward(model.actor.encoder(obs))
        log_prob = model.actor.head.manual_terms(logits, model.actor.head.manual_actions(actions))[0]
        assert torch.allclose(model.actor.evaluate(obs, actions)[0], log_prob, atol=1e-5)
        assert torch.allclose(model.critic(obs), buffer.values_tensor.reshape(-1), atol=1e-5)


def test_manual_path_is_taken_for_discrete_observations_and_learns_without_autograd_graphs():
    model = PPO("MlpPolicy", "FrozenLake-v1", n_steps=32, batch_size=16, seed=0)
    assert model._manual is not None
    before = model._params[0].detach().clone()
    model.learn(64)
    assert not torch.equal(before, model._params[0])
    assert all(p.grad is not None and not p.grad.requires_grad for p in model._params)


def test_ppo_optimizer_state_keeps_the_per_parameter_layout_in_files(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, seed=0).learn(64)
    reference = torch.optim.Adam(model._params, lr=1e-3)
    state = model.get_parameters()["policy.optimizer"]
    assert len(state["state"]) == len(model._params)
    for i, p in enumerate(model._params):
        assert state["state"][i]["exp_avg"].shape == p.shape
    assert state["param_groups"][0]["params"] == reference.state_dict()["param_groups"][0]["params"]
    model.save(tmp_path / "model.zip")
    loaded = PPO.load(tmp_path / "model.zip")
    restored = loaded.get_parameters()["policy.optimizer"]
    for i in state["state"]:
        assert torch.equal(restored["state"][i]["exp_avg_sq"], state["state"][i]["exp_avg_sq"])


# ---------------------------------------------------------------------------- SAC
def test_sac_target_critics_live_in_one_buffer_that_polyak_updates():
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=50, batch_size=32, tau=0.5, seed=0)
    model.learn(60)
    target, online = model._target_flat.data, model.critic_optimizer.flat_parameters.data
    assert target.shape == online.shape and not target.requires_grad
    before = target.clone()
    model.train(1, 32)  # a critic step, then target <- target + 0.5 * (critic - target)
    assert torch.allclose(target, before.lerp(online.detach(), 0.5))
    first = model.critic_target.qs[0].trunk[0].weight
    assert torch.equal(first.reshape(-1), target[: first.numel()])


def test_sac_bf16_matmuls_is_opt_in_and_close_to_float32():
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0)
    fp32 = SAC("MlpPolicy", env, learning_starts=100, seed=0)
    bf16 = SAC("MlpPolicy", env, learning_starts=100, seed=0, bf16_matmuls=True)
    assert not fp32.config.bf16_matmuls and fp32.bf16_matmuls is False
    fp32.learn(150)
    bf16.set_parameters(fp32.get_parameters())
    bf16.replay_buffer = fp32.replay_buffer
    torch.manual_seed(0)
    np.random.seed(0)
    batch = fp32.replay_buffer.sample_batch(256)
    q32 = fp32._run(fp32.critic.values, batch.observations, batch.actions)
    q16 = bf16._run(bf16.critic.values, batch.observations, batch.actions)
    assert q16.dtype == torch.float32
    assert not torch.equal(q16, q32)  # bfloat16 did run
    assert torch.allclose(q16, q32, rtol=0.05, atol=0.05)
    stats, (q, target) = bf16._gradient_step(batch)
    assert all(torch.isfinite(v).all() for v in [*stats.values(), q, target])
    assert all(p.dtype == torch.float32 for p in bf16.critic.parameters())


def test_sac_bf16_matmuls_survives_save_and_load(tmp_path):
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=50, batch_size=32, seed=0, bf16_matmuls=True).learn(60)
    model.save(tmp_path / "sac.zip")
    assert SAC.load(tmp_path / "sac.zip").config.bf16_matmuls is True
    with pytest.raises(ValueError, match="bf16_matmuls"):
        SAC("MlpPolicy", "Pendulum-v1", bf16_matmuls="yes")


@pytest.mark.cpu
@pytest.mark.parametrize("fast", [True, False])
def test_sac_bf16_matmuls_warns_at_learn_where_bfloat16_products_are_slow(monkeypatch, fast):
    """Where PyTorch has no fast bfloat16 CPU products (AVX2 CPUs), ``learn`` with ``bf16_matmuls=True`` warns
    and names the fix; float32 models never warn, and neither does building or loading a model."""
    monkeypatch.setattr(linear_module, "fast_bfloat16_products", lambda: fast)
    monkeypatch.setattr(linear_module, "bfloat16_product_speedup", lambda: 2.0)  # where fast: faster, as with AMX
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bf16 = SAC("MlpPolicy", "Pendulum-v1", learning_starts=20, batch_size=8, seed=0, bf16_matmuls=True)
        fp32 = SAC("MlpPolicy", "Pendulum-v1", learning_starts=20, batch_size=8, seed=0)
        assert not [w for w in caught if "bf16_matmuls" in str(w.message)]
        fp32.learn(25)
        assert not [w for w in caught if "bf16_matmuls" in str(w.message)]
        bf16.learn(25)
    slow = [w for w in caught if "bf16_matmuls" in str(w.message)]
    assert len(slow) == (0 if fast else 1)
    if not fast:
        message = str(slow[0].message)
        assert slow[0].category is UserWarning and slow[0].filename == __file__  # points at the learn call
        assert "no fast bfloat16 matrix products" in message and "Use bf16_matmuls=False" in message
        assert torch.backends.cpu.get_cpu_capability() in message


@pytest.mark.cpu
def test_sac_bf16_matmuls_warns_at_learn_where_oneDNNs_bfloat16_products_are_no_faster(monkeypatch):
    """oneDNN may take bfloat16 with no kernel faster than float32's (a virtual machine's Intel Xeon that showed
    AVX-512 BF16 but no AMX ran SAC's bf16 gradient steps 1.6x slower): ``learn`` measures a product once and
    warns with the factor it found."""
    monkeypatch.setattr(linear_module, "fast_bfloat16_products", lambda: True)
    for speedup, warned in ((0.625, True), (1.9, False)):
        monkeypatch.setattr(linear_module, "bfloat16_product_speedup", lambda speedup=speedup: speedup)
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=20, batch_size=8, seed=0, bf16_matmuls=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.learn(25)
        slow = [str(w.message) for w in caught if "bf16_matmuls" in str(w.message)]
        assert len(slow) == warned
        if warned:
            assert "a 256x256x256 bfloat16 matrix product takes 1.6x the time of a float32 one" in slow[0]
            assert "Use bf16_matmuls=False" in slow[0]


def test_bfloat16_product_speedup_is_measured_once_and_draws_nothing_from_torchs_generator():
    """A positive factor, measured once per process (cached: each learn reads it again), on matrices of its own
    generator: a seeded run's draws are the same whether or not its learn measured it first."""
    linear_module.bfloat16_product_speedup.cache_clear()
    torch.manual_seed(5)
    first = linear_module.bfloat16_product_speedup()
    drawn = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(torch.rand(3), drawn)
    assert first > 0 and linear_module.bfloat16_product_speedup() == first
    assert linear_module.bfloat16_product_speedup.cache_info().hits == 1


def test_fast_bfloat16_products_follows_pytorchs_onednn_check(monkeypatch):
    """covey's check is PyTorch's own (whether oneDNN takes bfloat16 products); without that check, fast."""
    assert linear_module.fast_bfloat16_products() is bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    for answer in (True, False):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda answer=answer: answer)
        assert linear_module.fast_bfloat16_products() is answer
    monkeypatch.setattr(torch.ops, "mkldnn", types.SimpleNamespace())  # a PyTorch without the check
    assert linear_module.fast_bfloat16_products() is True


def sac_pair(monkeypatch, env, policy: str = "MlpPolicy", **kwargs) -> tuple[SAC, SAC]:
    """Two SAC models in the same state, the first with hand-written gradients, the second with autograd."""
    models = []
    for manual in (True, False):
        monkeypatch.setattr(SAC, "manual_gradients", manual)
        model = SAC(policy, env, learning_starts=200, batch_size=64, seed=0, **kwargs)
        assert (model._manual is not None) == manual
        models.append(model)
    ours, ref = models
    ours.learn(200)  # the random warm-up fills the buffer; no gradient step yet
    ref.set_parameters(ours.get_parameters())
    ref.replay_buffer = ours.replay_buffer
    return ours, ref


SAC_CASES = {  # (env, policy, hyperparameters)
    "defaults": (lambda: "Pendulum-v1", "MlpPolicy", {}),
    "fixed temperature, three critics, tanh": (
        lambda: "Pendulum-v1",
        "MlpPolicy",
        dict(ent_coef=0.2, policy_kwargs=dict(n_critics=3, activation_fn=nn.Tanh, net_arch=[32, 16])),
    ),
    "two action dimensions, delayed targets": (
        lambda: SpaceEnv(spaces.Box(-1, 1, (5,), np.float32), spaces.Box(-2, 2, (2,), np.float32)),
        "MlpPolicy",
        dict(target_update_interval=2, policy_kwargs=dict(net_arch=dict(pi=[64], qf=[256, 256]))),
    ),
    "dict observations": (
        lambda: SpaceEnv(
            spaces.Dict({"x": spaces.Box(-1, 1, (3,), np.float32), "k": spaces.Discrete(4)}),
            spaces.Box(-1, 1, (1,), np.float32),
        ),
        "MultiInputPolicy",
        {},
    ),
    "state-dependent exploration": (lambda: "Pendulum-v1", "MlpPolicy", dict(use_sde=True)),
    "n-step returns": (lambda: "Pendulum-v1", "MlpPolicy", dict(n_steps=3)),
    "gSDE, expln, one std per feature, no mean clip, two actions": (
        lambda: SpaceEnv(spaces.Box(-1, 1, (5,), np.float32), spaces.Box(-2, 2, (2,), np.float32)),
        "MlpPolicy",
        dict(
            use_sde=True,
            policy_kwargs=dict(use_expln=True, full_std=False, log_std_init=0.5, clip_mean=0.0, net_arch=[64, 32]),
        ),
    ),
}


@pytest.mark.parametrize("case", list(SAC_CASES))
def test_manual_sac_steps_equal_autograd_steps(monkeypatch, case, kernel_forms):
    """The same random draws, then the same parameters (actor, critics, target critics, temperature), Adam
    states and logged statistics after several gradient steps. (Adam divides by the gradient's magnitude,
    so a weight whose gradient is float rounding away from 0 moves by up to ~2 x the learning rate either
    way; at the default rate that stays inside the tolerance.)"""
    make_env, policy, kwargs = SAC_CASES[case]
    ours, ref = sac_pair(monkeypatch, make_env(), policy, **kwargs)
    logs = []
    for model in (ours, ref):
        recorder = Recorder()
        model.set_logger(recorder)
        torch.manual_seed(7)
        np.random.seed(7)
        model.train(4, 64)
        model._dump_logs(1)
        logs.append(recorder.values)
    for name in ("actor", "critic", "critic_target"):
        for (key, p), q in zip(getattr(ours, name).named_parameters(), getattr(ref, name).parameters()):
            assert torch.allclose(p, q, atol=1e-5), (name, key)
    moved = ours.actor_optimizer.flat_parameters.data - ref.actor_optimizer.flat_parameters.data
    assert moved.abs().max() < 1e-5
    for opt in ("actor_optimizer", "critic_optimizer"):
        ours_state = getattr(ours, opt).state_dict()["state"]
        ref_state = getattr(ref, opt).state_dict()["state"]
        assert all(torch.allclose(ours_state[i]["exp_avg"], ref_state[i]["exp_avg"], atol=1e-6) for i in ref_state)
    if ours.log_ent_coef is not None:
        assert ours.log_ent_coef.item() == pytest.approx(ref.log_ent_coef.item(), abs=1e-6)
        assert ours.log_ent_coef.item() != 0.0  # the temperature did move
    train_keys = {key for key in logs[1] if key.startswith("train/")}
    assert train_keys == {key for key in logs[0] if key.startswith("train/")}
    assert {"train/actor_loss", "train/critic_loss", "train/q_mean", "train/ent_coef"} <= train_keys
    for key in train_keys:
        assert logs[0][key] == pytest.approx(logs[1][key], rel=1e-4, abs=1e-5), key


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(env_id="CartPole-v1"),
        dict(env_id="CartPole-v1", bf16_matmuls=True),
        dict(policy_kwargs=dict(value_head="twohot")),
        dict(policy_kwargs=dict(critic_ema_decay=0.9)),
        dict(policy_kwargs=dict(activation_fn=nn.ELU)),
        dict(policy="CnnPolicy", env_id="image"),
    ],
)
def test_sac_falls_back_to_autograd_outside_the_manual_path(kwargs):
    kwargs = dict(kwargs)
    env_id = kwargs.pop("env_id", "Pendulum-v1")
    policy = kwargs.pop("policy", "MlpPolicy")
    if env_id == "image":
        env_id = SpaceEnv(image_space((36, 36, 1)), spaces.Box(-1, 1, (1,), np.float32))
    model = SAC(policy, env_id, learning_starts=16, batch_size=16, buffer_size=100, seed=0, **kwargs)
    assert model._manual is None
    before = [p.detach().clone() for p in model.critic.parameters()]
    model.learn(24)
    assert any(not torch.equal(p, q) for p, q in zip(model.critic.parameters(), before))


@pytest.mark.cpu
@pytest.mark.skipif(not linear_module.AVAILABLE, reason="this PyTorch has no oneDNN linear op")
def test_manual_sac_step_reads_the_onednn_switch_at_every_train_call(monkeypatch):
    """Every network of the hand-written step, the target critics included, follows
    ``covey.networks.linear.ONEDNN`` as it is when ``train()`` is called."""
    monkeypatch.setattr(linear_module, "ONEDNN", True)
    model, _ = sac_pair(monkeypatch, "Pendulum-v1")
    manual = model._manual
    nets = [manual.actor_net, *manual.critic_nets, *manual.target_nets]
    for setting in (False, True):
        monkeypatch.setattr(linear_module, "ONEDNN", setting)
        model.train(1, 64)
        assert [net._plan(64) for net in nets] == [[False, setting, False]] * len(nets)


def test_manual_sac_step_with_bf16_matmuls_stays_close_to_float32(monkeypatch):
    """``bf16_matmuls=True`` keeps the hand-written step, its large products in bfloat16: from the same state
    and batches, the losses and parameters of a few steps stay within bfloat16's rounding of float32's, and
    differ from them (bfloat16 did run); parameters and optimizer states stay float32."""
    models = []
    for bf16 in (False, True):
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=200, batch_size=64, seed=0, bf16_matmuls=bf16)
        assert model._manual is not None
        assert [net.bf16 for net in (model._manual.actor_net, *model._manual.critic_nets)] == [bf16] * 3
        models.append(model)
    fp32, bf16 = models
    fp32.learn(200)
    bf16.set_parameters(fp32.get_parameters())
    bf16.replay_buffer = fp32.replay_buffer
    before = [p.detach().clone() for p in bf16.critic.parameters()]
    stats = []
    for model in (fp32, bf16):
        torch.manual_seed(7)
        np.random.seed(7)
        model._manual.bind()
        batch = model.replay_buffer.sample_batch(64)
        stats.append(model._manual.step(model, batch)[0])
    for key in ("critic_loss", "actor_loss"):
        assert stats[1][key].item() != stats[0][key].item()
        assert stats[1][key].item() == pytest.approx(stats[0][key].item(), rel=0.02, abs=1e-3), key
    lr = fp32.learning_rate
    for name in ("actor", "critic"):
        for p, q in zip(getattr(bf16, name).parameters(), getattr(fp32, name).parameters()):
            assert p.dtype == torch.float32
            assert (p - q).abs().max() <= 2 * lr + 1e-6  # Adam's first step moves each weight by at most ~lr
    moved = [(p - q).abs().max().item() for p, q in zip(bf16.critic.parameters(), before)]
    assert max(moved) > 0.5 * lr  # the step did update the critics
    bf16.learn(64)  # training continues through learn()
    assert all(torch.isfinite(p).all() for p in bf16.critic.parameters())

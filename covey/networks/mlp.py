"""MLP trunks and SB3-style ``net_arch`` parsing."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from covey.networks import linear as linear_module
from covey.networks.linear import ONEDNN_MIN_ROWS, Linear, in_onednn, onednn_linear, onednn_weight_grad
from covey.warning import warn_user


def mlp(in_dim: int, hidden: Sequence[int], activation: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    """``Linear -> activation`` for each width in ``hidden``; the identity when ``hidden`` is empty.

    The output width is ``hidden[-1]`` (or ``in_dim``), also stored as ``.out_dim``.
    """
    layers: list[nn.Module] = []
    width = in_dim
    for size in hidden:
        # Not ReLU(inplace=True): a forward hook on the Linear before it would find its output overwritten.
        layers += [Linear(width, int(size)), activation()]
        width = int(size)
    net = nn.Sequential(*layers)
    net.out_dim = width
    return net


# The activations :class:`ManualMLP` differentiates by hand.
_MANUAL_ACTIVATIONS = {nn.Tanh: "tanh", nn.ReLU: "relu"}
# Layers with fewer inputs (and at least this many outputs) take the transposed weight gradient in ManualMLP: a rule
# of its own, for any batch size, which covey.networks.linear.NARROW (autograd's layers) does not switch.
_NARROW_INPUTS = 16

SIGMOID_TANH = not linear_module.INTEL_MKL
"""Whether :class:`ManualMLP` evaluates tanh as ``2 * sigmoid(2x) - 1`` in training: several times faster than
``torch.tanh`` on CPUs other than Intel's (5.9 us vs 10.0 us for 64x64 on an AMD EPYC), several times slower on
Intel's, where ``torch.tanh`` runs in MKL's vector math (11.2 us vs 3.1 us; ``python -m benchmarks.fast_paths``)."""

PAIR_TRUNKS = True
"""Whether :meth:`PairedMLP.of` pairs networks (set it to False to run them one at a time)."""


class ManualMLP:
    """An :func:`mlp` trunk and a linear output layer, run with plain tensor operations and differentiated
    by hand: the training hot path of small networks, where autograd and module calls cost more than
    the arithmetic.

    :meth:`forward` keeps the layer outputs; :meth:`backward` takes d(loss)/d(output) and writes the
    gradients of every weight and bias into their ``.grad`` tensors (bound by :meth:`bind`), overwriting
    them. Tanh is evaluated as ``2 * sigmoid(2x) - 1`` where that is faster (:data:`SIGMOID_TANH`): the same
    function to float rounding (absolute error ~1e-7).

    ``bf16=True``: the large layers (:func:`~covey.networks.linear.in_onednn`'s size rule) multiply in
    bfloat16: their inputs, weights and output gradients rounded to bfloat16, the products accumulated in
    float32 and rounded to bfloat16 (as under autocast), everything else in float32. Half the time of a
    float32 product on CPUs with bfloat16 units. Each tensor is rounded once: a layer input's bfloat16 copy
    (kept in :class:`LayerInputs`) serves the forward product and the weight gradient, an output gradient's
    both gradient products, and the weights' copies (:meth:`hold_weights16`) every product until they change.

    >>> net = mlp(3, [8], nn.Tanh)
    >>> head = nn.Linear(8, 2)
    >>> manual = ManualMLP(net, head)
    >>> out, _ = manual.forward(torch.zeros(5, 3))
    >>> torch.allclose(out, head(net(torch.zeros(5, 3))), atol=1e-6)
    True
    """

    def __init__(self, trunk: nn.Sequential, out: nn.Linear, bf16: bool = False) -> None:
        if not self.supports(trunk, out):
            raise ValueError(
                "ManualMLP takes Linear layers (with biases) each followed by Tanh or ReLU, then a Linear output."
            )
        self.bf16 = bool(bf16)
        modules = list(trunk)
        self.kinds = [_MANUAL_ACTIVATIONS[type(act)] for act in modules[1::2]]
        self.linears = [*modules[0::2], out]
        # Detached views of the weights (updated in place by the optimizer): no autograd graph is recorded.
        self.weights = [linear.weight.detach() for linear in self.linears]
        self.weights_t = [weight.t() for weight in self.weights]  # (in, out) views
        self.biases = [linear.bias.detach() for linear in self.linears]
        self.shapes = [tuple(weight.shape) for weight in self.weights]  # (out, in)
        self._minus_one = torch.tensor(-1.0, dtype=self.weights[0].dtype, device=self.weights[0].device)
        # A layer with few inputs (the first, on small observations) gets its weight gradient as
        # (inputs^T g)^T: the (in, out) product is several times faster than the (out, in) one there
        # (5 us vs 14 us for 4 inputs, 64 outputs and 256 samples on one CPU core).
        self.narrow = [
            torch.empty(linear.in_features, linear.out_features, dtype=linear.weight.dtype, device=linear.weight.device)
            if linear.in_features < _NARROW_INPUTS <= linear.out_features
            else None
            for linear in self.linears
        ]
        self.bind()

    @staticmethod
    def supports(trunk: nn.Module, out: nn.Module) -> bool:
        """Whether ``trunk`` alternates Linear layers and Tanh/ReLU and ``out`` is a Linear layer (all with biases)."""
        if not isinstance(trunk, nn.Sequential) or not isinstance(out, nn.Linear) or len(trunk) % 2:
            return False
        modules = list(trunk)
        linears = [*modules[0::2], out]
        return all(type(m) in (nn.Linear, Linear) and m.bias is not None for m in linears) and all(
            type(m) in _MANUAL_ACTIVATIONS for m in modules[1::2]
        )

    def bind(self) -> None:
        """Read the parameters' current ``.grad`` tensors (before every update: they may have been replaced),
        and the CPU's kernel choices: whether large products go to oneDNN (``covey.networks.linear.ONEDNN``,
        float32 CPU weights; with ``bf16`` they multiply in bfloat16 instead), tanh's form (:data:`SIGMOID_TANH`)
        and the input gradient's (``covey.networks.linear.TRANSPOSED_INPUT_GRADS``)."""
        self.weight_grads = [linear.weight.grad for linear in self.linears]
        self.bias_grads = [linear.bias.grad for linear in self.linears]
        first = self.weights[0]
        self.onednn = linear_module.ONEDNN and first.device.type == "cpu" and first.dtype == torch.float32
        self.sigmoid_tanh = SIGMOID_TANH
        self.transposed_input_grads = linear_module.TRANSPOSED_INPUT_GRADS
        self._plans: dict[int, list[bool]] = {}
        self._weights16: list[torch.Tensor | None] | None = None

    def hold_weights16(self) -> None:
        """With ``bf16``: round the large layers' weights to bfloat16 now, and multiply with those copies until
        :meth:`release_weights16`, instead of rounding a weight again for every product. Call it again once the
        weights have changed (an optimizer step): the copies do not follow them."""
        if self.bf16:  # the layers that are large on any batch that has large layers
            plan = self._plan(linear_module.ONEDNN_MIN_ROWS)
            self._weights16 = [w.to(torch.bfloat16) if large else None for w, large in zip(self.weights, plan)]

    def release_weights16(self) -> None:
        """Drop :meth:`hold_weights16`'s copies: every product rounds its weight again."""
        self._weights16 = None

    def _weight16(self, i: int) -> torch.Tensor:
        held = self._weights16
        weight = held[i] if held is not None else None
        return self.weights[i].to(torch.bfloat16) if weight is None else weight

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, LayerInputs]:
        """The output ``(B, out)`` and the inputs of every layer (kept for :meth:`backward`)."""
        inputs = LayerInputs([x])
        h = x
        plan = self._plan(x.shape[0])
        for i, (weight_t, bias, kind, large) in enumerate(zip(self.weights_t, self.biases, self.kinds, plan)):
            by_sigmoid = kind == "tanh" and self.sigmoid_tanh
            if large:
                z = self._large_linear(i, h, inputs)
                z = z.mul_(2.0) if by_sigmoid else z
            elif by_sigmoid:  # tanh(z) = 2 * sigmoid(2z) - 1, with the factor 2 folded into the matrix multiply
                z = torch.addmm(bias, h, weight_t, beta=2.0, alpha=2.0)
            else:
                z = torch.addmm(bias, h, weight_t)
            h = _activate_(kind, z, by_sigmoid, self._minus_one)
            inputs.append(h)
        if plan[-1]:
            return self._large_linear(len(self.weights) - 1, h, inputs), inputs
        return torch.addmm(self.biases[-1], h, self.weights_t[-1]), inputs

    def _plan(self, rows: int) -> list[bool]:
        """Per layer, for a batch of ``rows``: whether its products (forward and both gradients) are large ones,
        in bfloat16 (``bf16``) or in oneDNN (:func:`covey.networks.linear.in_onednn`). Worked out once per batch
        size."""
        plan = self._plans.get(rows)
        if plan is None:
            large = self.onednn or self.bf16
            plan = self._plans[rows] = [large and in_onednn(rows, n_in, n_out) for n_out, n_in in self.shapes]
        return plan

    def _large_linear(self, i: int, h: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        """Layer ``i``'s output ``h @ W^T + b`` in float32, its product in bfloat16 (``bf16``, keeping the input's
        bfloat16 copy in ``inputs`` for the weight gradient) or oneDNN."""
        if self.bf16:
            h16 = inputs.bf16[i] = h.to(torch.bfloat16)
            product = torch.mm(h16, self._weight16(i).t())
            return torch.add(product, self.biases[i])  # bfloat16 + float32: a float32 result
        return onednn_linear(h, self.weights[i], self.biases[i])

    def _large_input_grad(self, i: int, g: torch.Tensor, g16: torch.Tensor | None, start: int = 0) -> torch.Tensor:
        """``g @ W[:, start:]`` in float32 for large layer ``i``: in bfloat16 (from ``g16``, ``g``'s bfloat16 copy
        when the caller has one) or oneDNN."""
        if self.bf16:
            g16 = g.to(torch.bfloat16) if g16 is None else g16
            return torch.mm(g16, self._weight16(i)[:, start:]).float()
        return onednn_linear(g, self.weights[i][:, start:].t())

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """The output ``(B, out)`` with the exact activations, as the modules compute it (acting)."""
        h = x
        for weight_t, bias, kind in zip(self.weights_t, self.biases, self.kinds):
            h = torch.addmm(bias, h, weight_t)
            h = h.tanh_() if kind == "tanh" else h.relu_()
        return torch.addmm(self.biases[-1], h, self.weights_t[-1])

    def backward(
        self, inputs: list[torch.Tensor], grad_out: torch.Tensor, grad_latent: torch.Tensor | None = None
    ) -> None:
        """Write d(loss)/d(weights and biases) into their ``.grad`` from ``grad_out`` = d(loss)/d(output), and
        ``grad_latent`` = d(loss)/d(the last hidden layer's output) along paths that skip the output layer (an
        action head that reads the latent itself, as gSDE's does; without hidden layers no weight is below it)."""
        g = grad_out  # (B, out)
        plan = self._plan(g.shape[0])
        last = len(self.weights) - 1
        for i in range(len(self.weights) - 1, -1, -1):
            g16 = None
            if plan[i] and self.bf16:  # (out, B) @ (B, in), rounded to float32 by the copy
                g16 = g.to(torch.bfloat16)
                self.weight_grads[i].copy_(torch.mm(g16.t(), _bf16_input(inputs, i)))
            elif plan[i]:
                self.weight_grads[i].copy_(onednn_weight_grad(g, inputs[i]))
            else:
                self.weight_grad(i, g, inputs[i])
            torch.sum(g, 0, out=self.bias_grads[i])
            if i == 0:
                break
            g = self._below(i, g, inputs, plan, grad_latent if i == last else None, g16)

    def weight_grad(self, i: int, g: torch.Tensor, x: torch.Tensor) -> None:
        """Write layer ``i``'s weight gradient from ``g`` = d(loss)/d(its output) ``(B, out)`` and its input ``x``
        ``(B, in)``: a float32 product outside oneDNN, transposed for a layer on few inputs (:attr:`narrow`)."""
        narrow = self.narrow[i]
        if narrow is not None:
            self.weight_grads[i].copy_(torch.mm(x.t(), g, out=narrow).t())
        else:
            torch.mm(g.t(), x, out=self.weight_grads[i])  # (out, in)

    def input_grad(self, inputs: list[torch.Tensor], grad_out: torch.Tensor, start: int = 0) -> torch.Tensor:
        """d(loss)/d(input) ``(B, in - start)`` for the input's columns from ``start`` on, from ``grad_out`` =
        d(loss)/d(output), leaving the weights' gradients alone (a network that the loss reaches through but
        does not train, e.g. SAC's critics in the actor's loss)."""
        g = grad_out
        plan = self._plan(g.shape[0])
        for i in range(len(self.weights) - 1, 0, -1):
            g = self._below(i, g, inputs, plan)
        if plan[0]:
            return self._large_input_grad(0, g, None, start)
        weight = self.weights[0][:, start:]  # (out, in - start)
        if self.transposed_input_grads:  # MKL is slow at few output columns, except on Intel CPUs
            return torch.mm(weight.t(), g.t()).t()
        return torch.mm(g, weight)

    def _below(
        self,
        i: int,
        g: torch.Tensor,
        inputs: list[torch.Tensor],
        plan: list[bool],
        extra: torch.Tensor | None = None,
        g16: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """d(loss)/d(output of layer i - 1) ``(B, in)`` from ``g`` = d(loss)/d(output of layer i) (``g16``: its
        bfloat16 copy, if made), plus ``extra`` = d(loss)/d(that output's activations) along other paths."""
        weight = self.weights[i]
        if plan[i]:
            g = self._large_input_grad(i, g, g16)
        else:
            g = _times_weight(g, weight)
        if extra is not None:
            g.add_(extra)
        # g is a new tensor here, still in cache: the activation's gradient overwrites it (a new tensor would
        # cost a cold write; SAC's gradient step takes about 0.97x the time)
        return _activation_grad_(self.kinds[i - 1], g, inputs[i])


class PairedMLP:
    """Two :class:`ManualMLP` networks with the same hidden layers on the same input (PPO's actor and critic
    trunks on a shared encoder), run as one: each hidden layer's two products are one batched product
    (``baddbmm``, ``bmm``), and its activation, activation gradient and bias gradient one kernel over both
    networks. A minibatch of two small MLPs on a CPU costs mostly per-operation overhead, which this halves
    for the trunks; the output layers, of any widths, stay apart.

    Nothing is copied: the weights and gradients are read and written through strided views of the one buffer
    that holds both networks' parameters (:class:`~covey.agents.base.FlatParameters`), layer ``i`` of ``b`` at a
    fixed distance after layer ``i`` of ``a``. :meth:`of` pairs two networks only where that holds and no layer
    takes the large-product path (oneDNN, bfloat16), so every product is a float32 product of the same shapes
    as the networks' own.

    >>> from covey.agents.base import FlatParameters
    >>> nets = [(mlp(4, [8, 8]), nn.Linear(8, n)) for n in (2, 1)]
    >>> flat = FlatParameters([p for trunk, out in nets for p in [*trunk.parameters(), *out.parameters()]])
    >>> pi, vf = (ManualMLP(trunk, out) for trunk, out in nets)
    >>> pair = PairedMLP.of(pi, vf)
    >>> x = torch.randn(5, 4)
    >>> logits, value, _ = pair.forward(x)
    >>> torch.allclose(logits, pi.forward(x)[0], atol=1e-6) and torch.allclose(value, vf.forward(x)[0], atol=1e-6)
    True
    """

    def __init__(self, a: ManualMLP, b: ManualMLP, views: dict[str, list[torch.Tensor]]) -> None:
        self.a, self.b = a, b
        self.weights = views["weights"]  # (2, out, in) per hidden layer
        self.weights_t = [w.transpose(1, 2) for w in self.weights]  # (2, in, out)
        self.biases = [bias.unsqueeze(1) for bias in views["biases"]]  # (2, 1, out)
        self.weight_grads = views["weight_grads"]
        self.bias_grads = views["bias_grads"]  # (2, out)
        self.narrow = [None if n is None else n.new_empty(2, *n.shape) for n in a.narrow[: len(self.weights)]]

    @staticmethod
    def of(a: ManualMLP, b: ManualMLP) -> PairedMLP | None:
        """``a`` and ``b`` paired, as bound now (:meth:`ManualMLP.bind`; pair them again after binding them
        again), or None where they cannot be: other hidden layers or activations, no hidden layer, a large layer
        (oneDNN, bfloat16), parameters and gradients not in one buffer with ``b``'s after ``a``'s, networks off
        the CPU, or :data:`PAIR_TRUNKS` off."""
        hidden = len(a.kinds)
        if (
            not PAIR_TRUNKS
            or a.weights[0].device.type != "cpu"  # measured on CPUs; elsewhere the networks run one at a time
            or hidden == 0
            or a.kinds != b.kinds
            or a.shapes[:hidden] != b.shapes[:hidden]
            or a.bf16
            or b.bf16
        ):
            return None
        if (a.onednn or b.onednn) and any(
            in_onednn(ONEDNN_MIN_ROWS, n_in, n_out) for n_out, n_in in a.shapes + b.shapes
        ):
            return None
        views: dict[str, list[torch.Tensor]] = {}
        for name in ("weights", "biases", "weight_grads", "bias_grads"):
            stacked = [_stacked(p, q) for p, q in zip(getattr(a, name)[:hidden], getattr(b, name)[:hidden])]
            if any(view is None for view in stacked):
                return None
            views[name] = stacked
        return PairedMLP(a, b, views)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list]:
        """Both networks' outputs ``(B, out_a)``, ``(B, out_b)`` on ``x`` ``(B, in)`` with :meth:`ManualMLP.forward`'s
        arithmetic, and what :meth:`backward` needs: the layers' inputs ``(2, B, width)``, then the last one's
        halves ``(B, width)``."""
        a, b = self.a, self.b
        h = x.expand(2, *x.shape)
        inputs = [h]
        for kind, weight_t, bias in zip(a.kinds, self.weights_t, self.biases):
            by_sigmoid = kind == "tanh" and a.sigmoid_tanh  # 2 * sigmoid(2z) - 1, as ManualMLP.forward
            scale = 2.0 if by_sigmoid else 1.0  # the factor 2 folded into the product
            z = torch.baddbmm(bias, h, weight_t, beta=scale, alpha=scale)
            h = _activate_(kind, z, by_sigmoid, a._minus_one)
            inputs.append(h)
        h_a, h_b = h.unbind(0)
        inputs.append((h_a, h_b))
        return torch.addmm(a.biases[-1], h_a, a.weights_t[-1]), torch.addmm(b.biases[-1], h_b, b.weights_t[-1]), inputs

    def backward(self, saved: list, grad_a: torch.Tensor, grad_b: torch.Tensor) -> None:
        """Write both networks' weight and bias gradients from d(loss)/d(output) of each, ``grad_a`` and
        ``grad_b``, as :meth:`ManualMLP.backward` would for each network (``saved``: :meth:`forward`'s)."""
        *inputs, halves = saved
        last = len(self.weights)
        g = torch.empty_like(inputs[last])  # d(loss)/d(last hidden layer's outputs), both networks
        for net, grad, h, g_net in zip((self.a, self.b), (grad_a, grad_b), halves, g.unbind(0)):
            net.weight_grad(last, grad, h)
            torch.sum(grad, 0, out=net.bias_grads[last])
            _times_weight(grad, net.weights[last], out=g_net)
        for i in range(last - 1, -1, -1):
            _activation_grad_(self.a.kinds[i], g, inputs[i + 1])
            narrow = self.narrow[i]
            if narrow is not None:  # (in, out) products: see ManualMLP.narrow
                self.weight_grads[i].copy_(torch.bmm(inputs[i].transpose(1, 2), g, out=narrow).transpose(1, 2))
            else:
                torch.bmm(g.transpose(1, 2), inputs[i], out=self.weight_grads[i])
            torch.sum(g, 1, out=self.bias_grads[i])
            if i > 0:
                g = torch.bmm(g, self.weights[i])


def _activate_(kind: str, z: torch.Tensor, by_sigmoid: bool, minus_one: torch.Tensor) -> torch.Tensor:
    """The activation of a layer's pre-activation ``z``, in place: ReLU, tanh, or tanh as ``2 * sigmoid(2x) - 1``
    (``by_sigmoid``: ``z`` holds twice the pre-activation); returns ``z``."""
    if by_sigmoid:
        return torch.add(minus_one, z.sigmoid_(), alpha=2.0, out=z)
    return z.tanh_() if kind == "tanh" else z.relu_()


def _times_weight(g: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``g @ weight``: d(loss)/d(a layer's input) from ``g`` = d(loss)/d(its output); for one output (a value
    head) as an outer product, which MKL is slow at."""
    if weight.shape[0] == 1:
        return torch.mul(g, weight, out=out)
    return torch.mm(g, weight, out=out)


def _activation_grad_(kind: str, g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``g`` = d(loss)/d(activation output ``h``) turned in place into d(loss)/d(its input), for Tanh (``g * (1 -
    h^2)``) or ReLU (``g * (h > 0)``); returns ``g``."""
    if kind == "tanh":
        return torch.ops.aten.tanh_backward.grad_input(g, h, grad_input=g)
    return torch.ops.aten.threshold_backward.grad_input(g, h, 0.0, grad_input=g)


def _stacked(p: torch.Tensor | None, q: torch.Tensor | None) -> torch.Tensor | None:
    """A ``(2, *shape)`` view of ``p`` and ``q``, tensors of one shape and strides in one storage, ``q`` after
    ``p`` and apart from it; None otherwise (a gradient that is None, say)."""
    if p is None or q is None or p.shape != q.shape or p.stride() != q.stride() or p.device != q.device:
        return None
    if p.untyped_storage().data_ptr() != q.untyped_storage().data_ptr():
        return None
    distance = q.storage_offset() - p.storage_offset()
    if distance < p.numel() or not p.is_contiguous():
        return None
    return p.as_strided((2, *p.shape), (distance, *p.stride()), p.storage_offset())


class LayerInputs(list):
    """:meth:`ManualMLP.forward`'s inputs of every layer (a list), and in :attr:`bf16` the bfloat16 copies that its
    bfloat16 products made of them, by layer, for the weight gradients to reuse."""

    def __init__(self, inputs: Sequence[torch.Tensor]) -> None:
        super().__init__(inputs)
        self.bf16: dict[int, torch.Tensor] = {}


def _bf16_input(inputs: list[torch.Tensor], i: int) -> torch.Tensor:
    """Layer ``i``'s input in bfloat16: the copy its forward product made, else a new one."""
    held = inputs.bf16.get(i) if isinstance(inputs, LayerInputs) else None
    return inputs[i].to(torch.bfloat16) if held is None else held


def parse_net_arch(net_arch: Sequence[int] | dict | None, keys: tuple[str, ...], default: list[int]) -> dict:
    """SB3's ``net_arch`` forms to one hidden-size list per network.

    A list applies to every network (separate weights); ``dict(pi=[..], vf=[..])`` names each one.

    >>> parse_net_arch([32], ("pi", "vf"), [64, 64])
    {'pi': [32], 'vf': [32]}
    >>> parse_net_arch(dict(pi=[8], vf=[16]), ("pi", "vf"), [64, 64])
    {'pi': [8], 'vf': [16]}
    """
    if net_arch is None:
        return {key: list(default) for key in keys}
    if isinstance(net_arch, (list, tuple)) and len(net_arch) == 1 and isinstance(net_arch[0], dict):
        warn_user(
            "net_arch=[dict(...)] is SB3's form from before version 1.8 (shared layers went then); "
            f"write net_arch=dict(...) instead. Reading it as net_arch={net_arch[0]!r}.",
            FutureWarning,
        )
        net_arch = net_arch[0]
    if isinstance(net_arch, dict):
        unknown = set(net_arch) - set(keys)
        if unknown:
            raise ValueError(
                f"net_arch has unknown keys {sorted(unknown)}; expected a list of layer sizes or a dict "
                f"with keys {list(keys)}, e.g. dict({keys[0]}=[64, 64], {keys[1]}=[64, 64])."
            )
        return {key: _sizes(net_arch.get(key, []), key) for key in keys}
    return {key: _sizes(net_arch, "net_arch") for key in keys}


def _sizes(sizes, name: str) -> list[int]:
    whole = (int, np.integer)
    if not isinstance(sizes, (list, tuple)) or not all(
        isinstance(s, whole) and not isinstance(s, bool) and s > 0 for s in sizes
    ):
        raise ValueError(
            f"net_arch entry {name!r} must be a list of positive layer sizes such as [64, 64], got {sizes!r}. "
            "(The old form [64, dict(pi=..., vf=...)], with shared layers, is gone since SB3 1.8: write "
            "dict(pi=..., vf=...).)"
        )
    return [int(s) for s in sizes]

"""Single-run ablations of covey's training fast paths, each measured side by side in one process.

    python -m benchmarks.fast_paths              # a few minutes on 2 cores
    python -m benchmarks.fast_paths --repeats 5  # more rounds per measurement (the minimum is kept)
    python -m benchmarks.fast_paths --repeats 1 --calls-scale 0.05 --skip-compile   # smoke run, seconds
    python -m benchmarks.fast_paths --groups poca   # only MA-POCA's rows

Each row times one operation two ways on the same data, in alternating rounds (so that the machine's speed drifting
reaches both ways alike), and reports the minimum over the rounds of the mean time per call: PPO minibatch updates
(hand-written gradients vs autograd; torch.tanh vs 2 * sigmoid(2x) - 1 in them; flat vs per-parameter optimizer
step), acting, tanh, the Adam step, gradient clipping, batching two layers into one bmm, the matrix multiplies that
bound the updates, torch.compile of a small MLP's loss and of MA-POCA's critic (its first call includes compiling),
SAC gradient steps (hand-written gradients vs autograd, float32 vs bfloat16 autocast, the critics' action gradients
direct or transposed, Adam steps flushing denormals or not, in-place ReLU), the two critics one at a time or stacked
into batched products, and MA-POCA's attention critic (scores shared by all sets vs one attention call per set,
softmax by hand, the set attention's softmax keys first and with its exponent floored) and minibatch (widths 64 and
128, the attention differentiated by hand or by autograd); and covey's linear layers against F.linear, alone and in
SAC's and POCA's updates (large float32 products in oneDNN vs all in MKL, transposed gradients of layers on few
inputs vs autograd's, and those products alone); and PPO's, SAC's and MA-POCA's updates against their own matrix
products run alone (recorded from one call, :class:`MatrixProducts`): how much of each update is arithmetic that no
change beside the products can remove; and PPO's minibatch and SAC's gradient step against SB3's at the same
settings, and MA-POCA's update against that of its SB3 baseline (PPO with parameter sharing, as in
benchmarks.poca_vs_supersuit), with covey's products alone against SB3's whole of it: the lowest time ratio to SB3
that no change beside the products can go under."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from stable_baselines3 import PPO as SB3PPO
from stable_baselines3 import SAC as SB3SAC
from stable_baselines3.common.env_util import make_vec_env
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from benchmarks.common import code_version, cpu_description
from benchmarks.poca_vs_supersuit import (
    BATCH_GROUP_STEPS,
    EPOCHS,
    N_AGENTS,
    N_COPIES,
    N_STEPS,
    make_poca,
    make_supersuit_ppo,
)
from covey import POCA, PPO, SAC
from covey.agents import base as base_module
from covey.agents import poca as poca_module
from covey.agents.base import FlatParameters
from covey.agents.poca import poca_objective, poca_outputs
from covey.agents.ppo import ppo_loss
from covey.agents.sac import q_diagnostics
from covey.networks import attention as attention_module
from covey.networks import linear as linear_module
from covey.networks.attention import POCACritic
from covey.networks.obs import batch_to_tensor

T = TypeVar("T")

mlp_module = importlib.import_module("covey.networks.mlp")  # covey.networks.mlp is also the function's name

PPO_SETTINGS = {
    "1 env (batch 64)": (1, {}),
    "8 envs (batch 256)": (
        8,
        dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, learning_rate=1e-3),
    ),
}


@dataclass(frozen=True)
class Timer:
    """Times two ways of doing one thing side by side (:meth:`pair`, :meth:`versus`), with ``calls`` multiplied by
    ``calls_scale`` (at least 1) and ``repeats`` rounds."""

    repeats: int = 3
    calls_scale: float = 1.0

    def pair(self, a: Callable[[], object], b: Callable[[], object], calls: int) -> tuple[float, float]:
        """Microseconds per call of ``a`` and of ``b``, timed in alternating rounds (A B, B A, A B, ...) so that
        the machine speeding up or slowing down reaches both: per function, the minimum over ``repeats`` rounds
        of the mean over ``calls`` calls (after a warm-up of each)."""
        calls = max(round(calls * self.calls_scale), 1)
        fns = (a, b)
        for fn in fns:
            for _ in range(max(calls // 10, 1)):
                fn()
        best = [float("inf"), float("inf")]
        for round_ in range(self.repeats):
            for i in (0, 1) if round_ % 2 == 0 else (1, 0):
                start = time.perf_counter()
                for _ in range(calls):
                    fns[i]()
                best[i] = min(best[i], (time.perf_counter() - start) / calls)
        return best[0] * 1e6, best[1] * 1e6

    def versus(
        self, name_a: str, a: Callable[[], object], name_b: str, b: Callable[[], object], calls: int
    ) -> tuple[str, float, str, float]:
        """``(name_a, us of a, name_b, us of b)`` from :meth:`pair`: the middle of a row."""
        t_a, t_b = self.pair(a, b, calls)
        return name_a, t_a, name_b, t_b


def with_setting(fn: Callable[[], T], name: str, value: object, module=linear_module) -> Callable[[], T]:
    """``fn`` with ``module``'s (default: ``covey.networks.linear``'s) ``name`` set to ``value`` while it runs
    (restored after); returns what ``fn`` returns."""

    def call() -> T:
        saved = getattr(module, name)
        setattr(module, name, value)
        try:
            return fn()
        finally:
            setattr(module, name, saved)

    return call


def in_mkl(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` with every float32 product in MKL, none in oneDNN (``covey.networks.linear.ONEDNN = False``)."""
    return with_setting(fn, "ONEDNN", False)


def onednn_on(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` with large float32 products in oneDNN where this PyTorch has it (``covey.networks.linear.ONEDNN =
    AVAILABLE``), whether or not covey's rule sends them there on this CPU: the other side of :func:`in_mkl`."""
    return with_setting(fn, "ONEDNN", linear_module.AVAILABLE)


def _copy(x: object) -> object:
    """A tensor's copy with its strides (a plain copy for a broadcast view); anything else as it is."""
    if not isinstance(x, torch.Tensor):
        return x
    if 0 in x.stride():
        return x.clone()
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)


class MatrixProducts(TorchDispatchMode):
    """Records the matrix products that the code run inside it makes (each op with copies of its arguments, in
    their layouts), to run them again alone (:meth:`replay`): the arithmetic that bounds an update, without the
    rest of it. Backward's products are recorded too."""

    OPS = {
        torch.ops.aten.mm,
        torch.ops.aten.addmm,
        torch.ops.aten.bmm,
        torch.ops.aten.baddbmm,
        torch.ops.aten.mv,
        torch.ops.aten.addmv,
        *([linear_module._onednn_linear] if linear_module._onednn_linear is not None else []),
    }

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []
        self.units = 1  # how many units of work (e.g. minibatches) the recorded call did

    @classmethod
    def of(cls, call: Callable[[], object], units: int = 1) -> MatrixProducts:
        """The products of one call of ``call``, which does ``units`` units of work (e.g. minibatches)."""
        products = cls()
        with products:
            call()
        products.units = units
        return products

    @property
    def per_unit(self) -> int:
        """How many products one unit of the recorded call's work made."""
        return len(self.calls) // self.units

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in self.OPS:
            self.calls.append((func, tree_map(_copy, args), tree_map(_copy, kwargs)))
        return func(*args, **kwargs)

    @torch.no_grad()
    def replay(self) -> list:
        """The recorded products run again, in order; their outputs."""
        return [func(*args, **kwargs) for func, args, kwargs in self.calls]


def products_row(
    timed: Timer, what: str, products: MatrixProducts, step: Callable[[], object], calls: int, per: int = 1
) -> tuple:
    """A row timing ``products`` (recorded from ``step`` or from a part of it, :meth:`MatrixProducts.of`) run alone
    against the whole of ``step``, both per unit of work (``step`` does ``per``)."""
    alone, whole = timed.pair(products.replay, step, calls)
    label = f"its matrix products alone ({products.per_unit} per call)"
    return what, label, alone / products.units, "the whole of it", whole / per


def against_sb3_rows(
    timed: Timer,
    what: str,
    products: MatrixProducts,
    step: Callable[[], object],
    sb3_step: Callable[[], object],
    calls: int,
    per: int = 1,
) -> list[tuple[str, str, float, str, float]]:
    """Two rows on ``step``, covey's, and ``sb3_step``, SB3's same work at the same settings: the two against each
    other, and covey's ``products`` (recorded from ``step`` or from a part of it, :meth:`MatrixProducts.of`) run
    alone against SB3's whole of it. The second ratio is the lowest that any change beside covey's products could
    bring the first to. All per unit of work (``step`` and ``sb3_step`` each do ``per``, e.g. minibatches)."""
    covey, sb3 = (t / per for t in timed.pair(step, sb3_step, calls))
    alone, sb3_whole = timed.pair(products.replay, sb3_step, calls)
    return [
        (what, "covey", covey, "SB3", sb3),
        (
            what,
            f"covey's matrix products alone ({products.per_unit} per call)",
            alone / products.units,
            "SB3's whole of it",
            sb3_whole / per,
        ),
    ]


def ppo_on(agent: type, n_envs: int, env_id: str = "CartPole-v1", **kwargs):
    """A PPO model of class ``agent`` (covey's or SB3's) as these measurements make it: on the CPU (on machines
    with CUDA too: these are the CPU's paths), ``n_envs`` copies of ``env_id``, seed 0, ``kwargs`` for its other
    arguments."""
    return agent("MlpPolicy", make_vec_env(env_id, n_envs, seed=0), seed=0, device="cpu", **kwargs)


def with_rollout(model):
    """An on-policy ``model``, covey's or SB3's (the same calls), with one rollout collected into its buffer
    (values, log-probs, advantages: what its ``train`` reads)."""
    _, callback = model._setup_learn(10**9, None, True, "ablation", False)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    return model


def collected_ppo(n_envs: int, manual: bool, env_id: str = "CartPole-v1", **kwargs) -> PPO:
    """A PPO model with one rollout collected (values, log-probs, advantages in its buffer)."""
    previous = PPO.manual_gradients
    PPO.manual_gradients = manual
    try:
        model = ppo_on(PPO, n_envs, env_id, **kwargs)
    finally:
        PPO.manual_gradients = previous
    return with_rollout(model)


def autograd_minibatch(model: PPO, flat_step: bool) -> Callable[[], None]:
    """One autograd minibatch update; the optimizer step over the flat buffer, or SB3-style per parameter
    (zero_grad to None, foreach clipping, fused Adam over the parameter list)."""
    batch = next(model.rollout_buffer.minibatches(model.batch_size))
    reference = torch.optim.Adam(model._params, lr=1e-4, eps=1e-5, fused=True)

    def step() -> None:
        loss, _ = ppo_loss(batch, model.actor, model.critic, 0.2, None, 0.0, 0.5, True)
        if flat_step:
            model._optimizer_step(loss, 0.5)
        else:
            reference.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model._params, 0.5, foreach=True)
            reference.step()

    return step


def ppo_rows(timed: Timer) -> list[tuple[str, str, float, str, float]]:
    rows = []
    for name, (n_envs, kwargs) in PPO_SETTINGS.items():
        manual = collected_ppo(n_envs, True, **kwargs)
        auto = collected_ppo(n_envs, False, **kwargs)
        minibatches = manual.n_epochs * -(-manual.n_steps * n_envs // manual.batch_size)
        t_manual, t_auto = (t / minibatches for t in timed.pair(manual.train, auto.train, 3))
        rows.append((f"PPO update per minibatch, {name}", "hand-written gradients", t_manual, "autograd", t_auto))
        products = MatrixProducts.of(manual.train, minibatches)
        rows.append(
            products_row(
                timed, f"PPO update per minibatch, {name}, hand-written", products, manual.train, 3, minibatches
            )
        )
        sb3 = ppo_on(SB3PPO, n_envs, **kwargs)
        sb3.learn(sb3.n_steps * n_envs)  # one rollout in its buffer, which its train() reads again at every call
        rows += against_sb3_rows(
            timed, f"PPO update per minibatch, {name}", products, manual.train, sb3.train, 3, minibatches
        )
        t_tanh, t_sigmoid = (
            t / minibatches
            for t in timed.pair(
                with_setting(manual.train, "SIGMOID_TANH", False, mlp_module),
                with_setting(manual.train, "SIGMOID_TANH", True, mlp_module),
                3,
            )
        )
        rows.append((f"PPO update per minibatch, {name}", "torch.tanh", t_tanh, "2 * sigmoid(2x) - 1", t_sigmoid))
        assert manual._manual.pair is not None  # SB3's default MlpPolicy: the trunks are paired
        t_paired, t_apart = (
            t / minibatches
            for t in timed.pair(manual.train, with_setting(manual.train, "PAIR_TRUNKS", False, mlp_module), 3)
        )
        rows.append((f"PPO update per minibatch, {name}", "trunks paired", t_paired, "one network at a time", t_apart))
        flat_step, per_parameter_step = autograd_minibatch(auto, True), autograd_minibatch(auto, False)

        def flat_step_linked(step=flat_step, flat: FlatParameters = auto.optimizer.flat_parameters) -> None:
            flat.relink()  # the per-parameter step before it set the gradients to None (a few us)
            step()

        flat, per_parameter = timed.pair(flat_step_linked, per_parameter_step, 200)
        auto.optimizer.flat_parameters.relink()
        rows.append(
            (f"PPO autograd minibatch step, {name}", "flat buffers", flat, "per-parameter optimizer", per_parameter)
        )
        obs = batch_to_tensor(manual._last_obs, manual.observation_space, manual.device)
        with torch.inference_mode():
            t_act, t_module = timed.pair(
                lambda m=manual, o=obs: m._manual.act(o), lambda m=manual, o=obs: m.actor.act(o), 2000
            )
        what = f"PPO acting, a batch of {n_envs} observation{'s' if n_envs > 1 else ''}"
        rows.append((what, "manual forward", t_act, "Actor.act (modules)", t_module))

        def in_torch(m: PPO = manual) -> np.ndarray:  # collect_rollouts' acting with PPO.numpy_acting = False
            o = batch_to_tensor(m._last_obs, m.observation_space, m.device)
            with torch.inference_mode():
                action = m._manual.act(o)
            return m.actor.to_env_actions(action.cpu().numpy())

        def in_numpy(m: PPO = manual) -> np.ndarray:
            return m.actor.to_env_actions(m._numpy_acting.act(m._last_obs))

        t_numpy, t_torch = timed.pair(in_numpy, in_torch, 2000)
        rows.append((f"{what}, VecEnv array to env actions", "NumPy", t_numpy, "PyTorch", t_torch))
    # RL-Zoo's Pendulum settings with use_sde (benchmarks.compare's ppo_pendulum_sde)
    sde = dict(n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0, learning_rate=1e-3, use_sde=True)
    manual, auto = (collected_ppo(4, on, "Pendulum-v1", sde_sample_freq=4, **sde) for on in (True, False))
    assert manual._manual is not None and auto._manual is None
    minibatches = manual.n_epochs * -(-manual.n_steps * 4 // manual.batch_size)
    t_manual, t_auto = (t / minibatches for t in timed.pair(manual.train, auto.train, 1))
    what = "PPO update per minibatch, Pendulum with use_sde (4 envs, batch 64)"
    rows.append((what, "hand-written gradients", t_manual, "autograd", t_auto))
    n_envs, kwargs = PPO_SETTINGS["8 envs (batch 256)"]
    wide = collected_ppo(n_envs, True, **kwargs, policy_kwargs=dict(net_arch=[256, 256]))
    minibatches = wide.n_epochs * -(-wide.n_steps * n_envs // wide.batch_size)
    onednn, mkl = (t / minibatches for t in timed.pair(onednn_on(wide.train), in_mkl(wide.train), 3))
    rows.append(
        (
            "PPO update per minibatch, 256x256 MLPs (batch 256)",
            "hand-written, large products in oneDNN",
            onednn,
            "hand-written, all in MKL",
            mkl,
        )
    )
    return rows


def kernel_rows(timed: Timer) -> list[tuple[str, str, float, str, float]]:
    rows = []
    minus_one = torch.tensor(-1.0)
    for shape in ((64, 64), (256, 64)):
        x = torch.randn(shape)
        rows.append(
            (
                f"tanh of {shape[0]}x{shape[1]}",
                *timed.versus(
                    "2 * sigmoid(2x) - 1",
                    lambda x=x: torch.add(minus_one, torch.sigmoid(2 * x), alpha=2.0),
                    "torch.tanh",
                    lambda x=x: torch.tanh(x),
                    2000,
                ),
            )
        )
    net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Linear(64, 2))
    flat = FlatParameters(list(net.parameters()))
    optimizer = flat.attach(torch.optim.Adam([flat.data], lr=1e-4, fused=True))
    flat.grad.normal_()
    optimizer.step()  # builds the state
    per_parameter = [torch.zeros_like(p, requires_grad=True) for p in net.parameters()]
    for p in per_parameter:
        p.grad = torch.randn_like(p)
    reference = torch.optim.Adam(per_parameter, lr=1e-4, fused=True)
    rows.append(
        (
            "Adam step, 64x64 MLP",
            *timed.versus(
                "flat, direct fused kernel",
                lambda: flat.step(optimizer),
                "fused Adam over the parameters",
                reference.step,
                2000,
            ),
        )
    )
    rows.append(
        (
            "gradient clipping, 64x64 MLP",
            *timed.versus(
                "flat buffer",
                lambda: flat.clip_grad_norm_(1e9),
                "clip_grad_norm_(foreach)",
                lambda: torch.nn.utils.clip_grad_norm_(per_parameter, 1e9, foreach=True),
                2000,
            ),
        )
    )
    h, w = torch.randn(2, 256, 64), torch.randn(2, 64, 64)
    rows.append(
        (
            "actor and critic layers 256x64x64",
            *timed.versus(
                "one batched bmm",
                lambda: torch.bmm(h, w),
                "two mm",
                lambda: (torch.mm(h[0], w[0]), torch.mm(h[1], w[1])),
                500,
            ),
        )
    )
    for m, k, n in ((256, 64, 64), (256, 256, 256)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        a16, b16 = a.bfloat16(), b.bfloat16()
        rows.append(
            (
                f"matrix multiply {m}x{k}x{n}",
                *timed.versus(
                    "bfloat16", lambda a=a16, b=b16: torch.mm(a, b), "float32", lambda a=a, b=b: torch.mm(a, b), 500
                ),
            )
        )
    g, w4 = torch.randn(256, 256), torch.randn(256, 4)
    rows.append(
        (
            "product 256x256 @ 256x4 (input gradient of a layer on 4 features)",
            *timed.versus(
                "oneDNN",
                lambda: linear_module._onednn_linear(g, w4.t(), None, "none", [], ""),
                "MKL",
                lambda: g @ w4,
                500,
            ),
        )
    )
    x4 = torch.randn(256, 4)
    rows.append(
        (
            "input gradient of a 4 -> 256 layer on 256 samples",
            *timed.versus("transposed, (W^T g^T)^T", lambda: (w4.t() @ g.t()).t(), "g @ W", lambda: g @ w4, 500),
        )
    )
    rows.append(
        (
            "weight gradient of a 4 -> 256 layer on 256 samples",
            *timed.versus("transposed, (x^T g)^T", lambda: (x4.t() @ g).t(), "g^T x", lambda: g.t() @ x4, 500),
        )
    )
    x4, w256, b256 = (torch.randn(*shape, requires_grad=True) for shape in ((256, 4), (256, 4), (256,)))
    g256 = torch.randn(256, 256)
    rows.append(
        (
            "linear layer 4 -> 256 on 256 samples, forward and backward",
            *timed.versus(
                "transposed gradient products (covey linear)",
                with_setting(lambda: linear_module.linear(x4, w256, b256).backward(g256), "NARROW", True),
                "F.linear's autograd",
                lambda: torch.nn.functional.linear(x4, w256, b256).backward(g256),
                500,
            ),
        )
    )
    for m, k, n in ((256, 64, 64), (256, 256, 256), (1536, 128, 384)):
        x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
        rows.append(
            (
                f"float32 linear layer {m}x{k}x{n}, forward",
                *timed.versus(
                    "covey linear (oneDNN from 8192 weights)",
                    onednn_on(lambda x=x, w=w, b=b: linear_module.linear(x, w, b)),
                    "F.linear (MKL)",
                    lambda x=x, w=w, b=b: torch.nn.functional.linear(x, w, b),
                    300,
                ),
            )
        )
    return rows


def compile_rows(timed: Timer) -> list[tuple[str, str, float, str, float]]:
    """torch.compile of a 64x64 MLP loss (forward and backward): its first call against eager calls."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh())
    x = torch.randn(64, 4)

    def loss() -> torch.Tensor:
        return net(x).square().mean()

    compiled = torch.compile(loss)
    start = time.perf_counter()
    compiled().backward()
    first = (time.perf_counter() - start) * 1e6
    steady, eager = timed.pair(lambda: compiled().backward(), lambda: loss().backward(), 500)
    return [
        ("64x64 MLP loss forward and backward", "torch.compile, first call", first, "eager", eager),
        ("64x64 MLP loss forward and backward", "torch.compile, later calls", steady, "eager", eager),
        *poca_compile_rows(timed),
    ]


def collected_poca(**policy_kwargs) -> POCA:
    """benchmarks.poca_vs_supersuit's POCA (torch seeded) after one rollout of 1024 env steps and its update."""
    torch.manual_seed(0)
    return make_poca(0, **policy_kwargs).learn(1024)


def first_minibatch(model: POCA):
    """The first minibatch of 256 group-steps of ``model``'s rollout buffer."""
    return next(iter(model.rollout_buffer.minibatches(256)))


def poca_compile_rows(timed: Timer) -> list[tuple[str, str, float, str, float]]:
    """torch.compile of MA-POCA's critic (``POCACritic.raw``, forward and backward) on a minibatch of the settings
    of benchmarks.poca_vs_supersuit, against covey's eager critic. Compiled, the set attention is the autograd form
    (``set_attention``), which Inductor can fuse; eager, covey's default (differentiated by hand). The first call
    also checks that both compute the same values."""
    model = collected_poca()
    batch = first_minibatch(model)
    what = f"POCA critic forward and backward, {batch.present.shape[0]} groups of {batch.present.shape[1]}"

    def step(raw: Callable) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        def call() -> tuple[torch.Tensor, torch.Tensor]:
            value, baseline = raw(batch.observations, batch.actions, batch.present)
            (value.sum() + baseline.sum()).backward()
            return value.detach(), baseline.detach()

        return call

    eager = step(model.critic.raw)
    compiled = with_setting(step(torch.compile(model.critic.raw)), "SET_ATTENTION_BY_HAND", False, attention_module)
    start = time.perf_counter()
    compiled_outputs = compiled()
    first = (time.perf_counter() - start) * 1e6
    torch.testing.assert_close(compiled_outputs, eager(), rtol=1e-4, atol=1e-5)
    steady, eager_us = timed.pair(compiled, eager, 30)
    return [
        (what, "torch.compile, first call", first, "eager (covey)", eager_us),
        (what, "torch.compile, later calls", steady, "eager (covey)", eager_us),
    ]


def sac_on_pendulum(agent: type, **kwargs):
    """A SAC model of class ``agent`` (covey's or SB3's) on one Pendulum env as these measurements make it: on
    the CPU, learning rate 1e-3, gradient steps from env step 300 on, seed 0, ``kwargs`` for its other arguments."""
    env = make_vec_env("Pendulum-v1", 1, seed=0)
    return agent("MlpPolicy", env, learning_rate=1e-3, learning_starts=300, seed=0, device="cpu", **kwargs)


def sac_model(bf16: bool = False, manual: bool = True, timesteps: int = 400, **kwargs) -> SAC:
    """SAC on Pendulum after ``timesteps - 300`` gradient steps; ``manual``: hand-written gradients (where they
    apply); ``kwargs``: more of SAC's arguments (e.g. ``use_sde=True``)."""
    previous = SAC.manual_gradients
    SAC.manual_gradients = manual
    try:
        model = sac_on_pendulum(SAC, bf16_matmuls=bf16, **kwargs)
    finally:
        SAC.manual_gradients = previous
    return model.learn(timesteps)


def rounding_per_product(model: SAC) -> Callable[[], None]:
    """A gradient step of ``model`` (``bf16_matmuls=True``) whose products each round their weight to bfloat16
    again, as before ``ManualMLP.hold_weights16`` (the same numbers: only the rounding is repeated)."""
    nets = [model._manual.actor_net, *model._manual.critic_nets, *model._manual.target_nets]

    def step() -> None:
        for net in nets:
            net.hold_weights16 = net.release_weights16  # nothing is held
        try:
            model.train(1, 256)
        finally:
            for net in nets:
                del net.hold_weights16

    return step


class StackedCritics:
    """A SAC model's critics run as one network whose layers hold every critic's layer: the first layers, on the
    same input, as one product; the later ones as batched products (``bmm``, in MKL on every CPU), every ReLU
    and its gradient as one kernel over all critics. Copies of the weights; its own gradient buffers. Only to be
    timed against the critics one at a time (:class:`~covey.networks.mlp.ManualMLP`, what covey runs)."""

    def __init__(self, nets: Sequence[mlp_module.ManualMLP]) -> None:
        if any(kind != "relu" for net in nets for kind in net.kinds):
            raise ValueError("StackedCritics takes ReLU networks.")
        layers = range(len(nets[0].weights))
        self.weights = [torch.stack([net.weights[i] for net in nets]) for i in layers]  # (n, out, in)
        self.biases = [torch.stack([net.biases[i] for net in nets]).unsqueeze(1) for i in layers]  # (n, 1, out)
        self.weight_grads = [torch.zeros_like(w) for w in self.weights]
        self.bias_grads = [torch.zeros_like(b) for b in self.biases]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The critics' outputs ``(n, B, out)`` on ``x`` ``(B, in)``, and every layer's input."""
        n, width, n_in = self.weights[0].shape
        first = torch.addmm(self.biases[0].reshape(-1), x, self.weights[0].reshape(n * width, n_in).t())
        h = first.relu_().view(x.shape[0], n, width).transpose(0, 1)  # (n, B, width), a view
        inputs = [x, h]
        for weight, bias in zip(self.weights[1:-1], self.biases[1:-1]):
            h = torch.baddbmm(bias, h, weight.transpose(1, 2)).relu_()
            inputs.append(h)
        return torch.baddbmm(self.biases[-1], h, self.weights[-1].transpose(1, 2)), inputs

    def backward(self, inputs: list[torch.Tensor], grad_out: torch.Tensor) -> None:
        """Every critic's weight and bias gradients from ``grad_out`` ``(n, B, out)``, into this object's buffers."""
        g = grad_out
        for i in range(len(self.weights) - 1, 0, -1):
            torch.bmm(g.transpose(1, 2), inputs[i], out=self.weight_grads[i])
            torch.sum(g, 1, keepdim=True, out=self.bias_grads[i])
            g = g * self.weights[i] if self.weights[i].shape[1] == 1 else torch.bmm(g, self.weights[i])
            g = torch.ops.aten.threshold_backward(g, inputs[i], 0.0)
        x = inputs[0]
        torch.bmm(g.transpose(1, 2), x.expand(len(g), *x.shape), out=self.weight_grads[0])
        torch.sum(g, 1, keepdim=True, out=self.bias_grads[0])


def stacked_critics_row(timed: Timer, model: SAC) -> tuple[str, str, float, str, float]:
    """The critics' forward and backward on a replay batch of ``model`` (hand-written step): one at a time, as
    covey runs them, against :class:`StackedCritics`, whose outputs and gradients are checked to be the same."""
    nets = model._manual.critic_nets
    batch = model.replay_buffer.sample_batch(256)
    x = torch.cat([model.critic.encoder(batch.observations), batch.actions], dim=-1)
    grad = torch.randn(len(nets), 256, 1, generator=torch.Generator().manual_seed(0)) / 256
    stacked = StackedCritics(nets)

    def one_at_a_time() -> torch.Tensor:
        outputs = [net.forward(x) for net in nets]
        for net, (_, inputs), g in zip(nets, outputs, grad):
            net.backward(inputs, g)
        return torch.stack([q for q, _ in outputs])

    def together() -> torch.Tensor:
        q, inputs = stacked.forward(x)
        stacked.backward(inputs, grad)
        return q

    with torch.no_grad():
        torch.testing.assert_close(together(), one_at_a_time(), rtol=1e-4, atol=1e-5)
        for i in range(len(stacked.weights)):
            for n, net in enumerate(nets):
                torch.testing.assert_close(stacked.weight_grads[i][n], net.weight_grads[i], rtol=1e-4, atol=1e-6)
                torch.testing.assert_close(stacked.bias_grads[i][n, 0], net.bias_grads[i], rtol=1e-4, atol=1e-6)
        return (
            f"SAC's {len(nets)} critics, forward and backward, 256 samples (Pendulum 256x256)",
            *timed.versus("one at a time (covey)", one_at_a_time, "stacked: batched products", together, 100),
        )


def bf16_rows(timed: Timer, fp32: SAC, steps: Callable[[SAC], Callable[[], None]]) -> list[tuple]:
    """SAC's gradient step with ``bf16_matmuls=True``: against the float32 step of ``fp32``, against autograd under
    autocast, and against rounding the weights for every product."""
    bf16, bf16_auto = sac_model(bf16=True), sac_model(bf16=True, manual=False)
    assert bf16._manual is not None and bf16_auto._manual is None
    return [
        (
            "SAC gradient step, Pendulum 256x256",
            *timed.versus("bf16_matmuls=True, hand-written", steps(bf16), "float32, hand-written", steps(fp32), 40),
        ),
        (
            "SAC gradient step, Pendulum 256x256, bf16_matmuls=True",
            *timed.versus("hand-written gradients", steps(bf16), "autograd under autocast", steps(bf16_auto), 40),
        ),
        (
            "SAC gradient step, Pendulum 256x256, bf16_matmuls=True",
            *timed.versus(
                "weights rounded once per change", steps(bf16), "per product", rounding_per_product(bf16), 40
            ),
        ),
    ]


def sac_rows(timed: Timer) -> list[tuple[str, str, float, str, float]]:
    """SAC's gradient step. The rows on covey's linear layers and ReLU modules (transposed gradients, which
    layers go to oneDNN, in-place ReLU) time the autograd step, where those apply; the others the default,
    hand-written one."""
    fp32, auto = sac_model(), sac_model(manual=False)
    assert fp32._manual is not None and auto._manual is None

    def steps(model: SAC) -> Callable[[], None]:
        return lambda: model.train(1, 256)

    rows = [
        (
            "SAC gradient step, Pendulum 256x256",
            *timed.versus("hand-written gradients", steps(fp32), "autograd", steps(auto), 40),
        ),
    ]
    if linear_module.fast_bfloat16_products():  # elsewhere they take most of an hour (main names them left out)
        rows += bf16_rows(timed, fp32, steps)
    products = MatrixProducts.of(steps(fp32))
    rows.append(products_row(timed, "SAC gradient step, Pendulum 256x256, hand-written", products, steps(fp32), 40))
    sb3 = sac_on_pendulum(SB3SAC).learn(400)
    rows += against_sb3_rows(
        timed, "SAC gradient step, Pendulum 256x256", products, steps(fp32), lambda: sb3.train(1, 256), 40
    )
    sde, sde_auto = sac_model(use_sde=True), sac_model(use_sde=True, manual=False)
    assert sde._manual is not None and sde_auto._manual is None
    rows.append(
        (
            "SAC gradient step, Pendulum 256x256, use_sde=True",
            *timed.versus("hand-written gradients", steps(sde), "autograd", steps(sde_auto), 40),
        )
    )

    rows.append(
        (
            "SAC gradient step, Pendulum 256x256",
            *timed.versus(
                "critics' action gradients g @ W",
                with_setting(steps(fp32), "TRANSPOSED_INPUT_GRADS", False),
                "transposed, (W^T g^T)^T",
                with_setting(steps(fp32), "TRANSPOSED_INPUT_GRADS", True),
                40,
            ),
        )
    )
    # Two models in the same state after 1,000 gradient steps (fewer with --calls-scale below 1), trained without
    # flushing denormals: by then many of the Adam momenta are denormal (those of weights into and out of ReLU
    # units that no sample activates).
    updates = max(round(1000 * min(timed.calls_scale, 1.0)), 1)
    flush = base_module.FLUSH_DENORMALS
    base_module.FLUSH_DENORMALS = False
    try:
        trained = [sac_model(timesteps=300 + updates) for _ in range(2)]
    finally:
        base_module.FLUSH_DENORMALS = flush
    momenta = trained[1].critic_optimizer.state[trained[1].critic_optimizer.flat_parameters.data]["exp_avg"]
    share = ((momenta != 0) & (momenta.abs() < torch.finfo(momenta.dtype).tiny)).float().mean().item()
    rows.append(
        (
            f"SAC gradient step, Pendulum 256x256, after {updates:,} steps ({share:.0%} of the critics' momenta "
            "denormal)",
            *timed.versus(
                "Adam steps flushing denormals",
                steps(trained[0]),
                "not flushing",
                with_setting(steps(trained[1]), "FLUSH_DENORMALS", False, module=base_module),
                40,
            ),
        )
    )
    rows.append(
        (
            "SAC gradient step, Pendulum 256x256",
            *timed.versus("large products in oneDNN", onednn_on(steps(fp32)), "all in MKL", in_mkl(steps(fp32)), 40),
        )
    )
    rows.append(stacked_critics_row(timed, fp32))

    def diagnostics_every_step(on: bool) -> Callable[[], None]:
        def step() -> None:
            fp32.train(1, 256)
            if on:  # what SAC did before: the critics' diagnostics of every step, read out after it
                q, target = fp32._q_and_targets[-1]
                [value.item() for value in q_diagnostics(q[None], target[None]).values()]

        return step

    rows.append(
        (
            "SAC gradient step, Pendulum 256x256",
            *timed.versus(
                "critics' diagnostics when a row of logs is written",
                diagnostics_every_step(False),
                "at every step",
                diagnostics_every_step(True),
                40,
            ),
        )
    )

    rows.append(
        (
            "SAC gradient step, Pendulum 256x256",
            *timed.versus(
                "first layers' gradients transposed (autograd step)",
                with_setting(steps(auto), "NARROW", True),
                "autograd's products",
                with_setting(steps(auto), "NARROW", False),
                40,
            ),
        )
    )
    large_only = linear_module.in_onednn

    def also_narrow(rows: int, n_in: int, n_out: int) -> bool:  # the critics' first layers: 4 -> 256
        return large_only(rows, n_in, n_out) or (n_in < 16 and n_out >= 128 and rows >= 128)

    rows.append(
        (
            "SAC gradient step, Pendulum 256x256",
            *timed.versus(
                "covey (4 -> 256 layers: MKL, transposed gradients; autograd step)",
                with_setting(steps(auto), "in_onednn", large_only),
                "4 -> 256 layers in oneDNN too",
                with_setting(steps(auto), "in_onednn", also_narrow),
                40,
            ),
        )
    )
    relus = [m for net in (auto.actor, auto.critic, auto.critic_target) for m in net.modules()]
    relus = [m for m in relus if isinstance(m, torch.nn.ReLU)]

    def with_inplace(on: bool) -> Callable[[], None]:
        def step() -> None:
            for m in relus:
                m.inplace = on
            auto.train(1, 256)

        return step

    inplace, out_of_place = timed.pair(with_inplace(True), with_inplace(False), 40)
    for m in relus:
        m.inplace = True
    rows.append(
        (
            "SAC gradient step, Pendulum 256x256",
            "in-place ReLU (autograd step)",
            inplace,
            "ReLU to a new tensor",
            out_of_place,
        )
    )
    return rows


def poca_rows(timed: Timer) -> list[tuple[str, str, float, str, float]]:
    """MA-POCA's update on simple_spread (the settings of benchmarks.poca_vs_supersuit): its attention critic,
    a whole minibatch, and the whole update against that of the benchmark's SB3 baseline on a rollout of the same
    env steps (the same number of minibatches, each of as many agent-steps)."""
    models = {width: collected_poca(attention_width=width) for width in (64, 128)}
    batch = first_minibatch(models[128])
    critic = models[128].critic  # the default width
    group = f"{batch.present.shape[0]} groups of {batch.present.shape[1]}"

    def backward(pooled: Callable) -> Callable[[], None]:
        def step() -> None:
            value, baseline = pooled(critic, batch.observations, batch.actions, batch.present)
            (value.sum() + baseline.sum()).backward()

        return step

    rows = [
        (
            f"POCA critic attention, forward and backward, {group}",
            *timed.versus(
                "scores shared by all sets",
                backward(POCACritic.pooled),
                "one attention call per set",
                backward(POCACritic.pooled_per_set),
                50,
            ),
        )
    ]
    scores = torch.randn(256, 4, 12, 6, requires_grad=True)

    def by_hand() -> None:
        weights = (scores - scores.detach().amax(dim=-1, keepdim=True)).exp()
        (weights / weights.sum(dim=-1, keepdim=True)).sum().backward()

    rows.append(
        (
            "softmax over 6 entities, 256x4x12x6, forward and backward",
            *timed.versus(
                "by hand", by_hand, "torch.softmax", lambda: torch.softmax(scores, dim=-1).sum().backward(), 200
            ),
        )
    )
    rows += set_softmax_rows(timed)

    def update(model) -> Callable[[], None]:
        def step() -> None:
            log_prob, entropy, raw_value, raw_baseline, _, mb = poca_outputs(batch, model.actor, model.critic)
            loss, _ = poca_objective(
                log_prob, entropy, raw_value, raw_baseline, model.critic.value_head, mb, 0.2, model.config
            )
            model._optimizer_step(loss, model.config.max_grad_norm)

        return step

    rows.append(
        (
            f"POCA update per minibatch, {group}",
            *timed.versus("attention width 64", update(models[64]), "attention width 128", update(models[128]), 30),
        )
    )
    # One minibatch's products: the whole update's 16, recorded together, would be read back from memory, not from
    # the caches that hold them in training.
    products = MatrixProducts.of(update(models[128]))
    rows.append(products_row(timed, f"POCA update per minibatch, {group}", products, update(models[128]), 30))
    sb3 = make_supersuit_ppo(0)
    sb3.learn(N_STEPS * N_COPIES * N_AGENTS)  # one rollout in its buffer, which its train() reads again at every call
    minibatches = EPOCHS * N_STEPS * N_COPIES // BATCH_GROUP_STEPS  # SB3's too: 3x the entries, 3x the batch
    rows += against_sb3_rows(
        timed,
        f"POCA update per minibatch, {group} (SB3's PPO: {BATCH_GROUP_STEPS * N_AGENTS} agent entries)",
        products,
        models[128].train,
        sb3.train,
        3,
        minibatches,
    )
    rows.append(
        (
            f"POCA update per minibatch, {group}",
            *timed.versus(
                "large products in oneDNN",
                onednn_on(update(models[128])),
                "all in MKL",
                in_mkl(update(models[128])),
                30,
            ),
        )
    )

    def switched(what: str, name: str, module, on: str, off: str) -> tuple[str, str, float, str, float]:
        """The minibatch with ``module.name`` True (``on``) against False (``off``)."""
        step = update(models[128])
        return (
            what,
            *timed.versus(on, with_setting(step, name, True, module), off, with_setting(step, name, False, module), 30),
        )

    rows.append(
        switched(
            f"POCA update per minibatch, {group}",
            "SET_ATTENTION_BY_HAND",
            attention_module,
            "attention differentiated by hand",
            "autograd",
        )
    )
    rows.append(
        switched(
            f"POCA update per minibatch, {group}, every slot present",
            "RESHAPE_WHEN_ALL_PRESENT",
            poca_module,
            "present agent-steps by reshape",
            "by boolean index",
        )
    )
    rollout = models[128]
    groups = rollout.rollout_buffer.present.shape[0] * rollout.rollout_buffer.present.shape[1]
    rows.append(
        (
            f"POCA rollout evaluation, {groups} group-steps of 3",
            *timed.versus(
                "passes of 256",
                with_setting(rollout._evaluate_rollout, "_EVAL_CHUNK", 256, poca_module),
                "one pass",
                with_setting(rollout._evaluate_rollout, "_EVAL_CHUNK", groups, poca_module),
                5,
            ),
        )
    )
    return rows


def set_softmax_rows(timed: Timer) -> list[tuple[str, str, float, str, float]]:
    """The set attention's in-place softmax (``_SetAttention``'s forward) on the POCA sets' scores for 256 groups of
    3 agents and 4 heads, where every set masks half the entities: its layout, and its exponent floored at -30
    (masked entries zeroed) against exp of -inf."""
    g = torch.Generator().manual_seed(0)
    queries, members = attention_module._poca_sets(3, torch.device("cpu"))
    first = (members.float() * torch.rand(256, *members.shape, generator=g)).argmax(-1, keepdim=True)
    attended = members & (torch.rand(256, *members.shape, generator=g) < 0.9)  # some agents absent
    attended.scatter_(-1, first, True)  # every row attends to at least one member
    scores = torch.randn(256, 4, *members.shape, generator=g)  # (B, heads, R, m)
    keys_last = (scores, attended[:, None], -1)  # scores, where they are attended, the keys' axis
    keys_first = (scores.permute(3, 0, 1, 2).contiguous(), attended.permute(2, 0, 1).unsqueeze(2), 0)

    def softmax(layout: tuple[torch.Tensor, torch.Tensor, int], floor: bool) -> Callable[[], None]:
        laid_out, attending, keys = layout
        mask = torch.where(attending, 0.0, float("-inf"))

        def run() -> None:
            w = laid_out.add(mask)
            w.sub_(w.amax(dim=keys, keepdim=True))
            if floor:
                w.clamp_(min=attention_module._EXP_FLOOR).exp_().mul_(attending)
            else:
                w.exp_()
            w.div_(w.sum(dim=keys, keepdim=True))

        return run

    what = "set attention's masked softmax over 6 entities, 256x4x12, forward"
    return [
        (
            what,
            *timed.versus(
                "keys first (6, 256, 4, 12)", softmax(keys_first, True), "keys last", softmax(keys_last, True), 200
            ),
        ),
        (
            what,
            *timed.versus(
                "exp floored at -30, masked zeroed",
                softmax(keys_first, True),
                "exp of -inf",
                softmax(keys_first, False),
                200,
            ),
        ),
    ]


def duration(us: float) -> str:
    """Microseconds in the unit that reads best."""
    if us >= 1e6:
        return f"{us / 1e6:.1f} s"
    return f"{us / 1e3:.2f} ms" if us >= 1e3 else f"{us:.1f} us"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fast_paths", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--calls-scale", type=float, default=1.0, help="multiplies the calls per measurement (at least 1 call)"
    )
    parser.add_argument("--skip-compile", action="store_true", help="leave out the torch.compile rows (~30 s)")
    parser.add_argument(
        "--groups",
        default="ppo,kernels,compile,sac,poca",
        help="comma-separated row groups to run, of ppo, kernels, compile, sac, poca (default: all)",
    )
    args = parser.parse_args(argv)
    groups = {"ppo": ppo_rows, "kernels": kernel_rows, "compile": compile_rows, "sac": sac_rows, "poca": poca_rows}
    chosen = [name.strip() for name in args.groups.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in groups]
    if unknown or not chosen:
        parser.error(f"--groups takes names of {', '.join(groups)}; got {args.groups!r}")
    if args.repeats < 1 or args.threads < 1 or args.calls_scale <= 0:
        parser.error("--repeats and --threads must be >= 1, --calls-scale > 0")
    torch.set_num_threads(args.threads)
    timed = Timer(args.repeats, args.calls_scale)
    print("| measurement | variant A | A | variant B | B | A/B |")
    print("|---|---|---:|---|---:|---:|")
    for rows in (groups[name] for name in groups if name in chosen and not (name == "compile" and args.skip_compile)):
        for what, name_a, a, name_b, b in rows(timed):
            print(f"| {what} | {name_a} | {duration(a)} | {name_b} | {duration(b)} | {a / b:.2f} |", flush=True)
    if "sac" in chosen and not linear_module.fast_bfloat16_products():
        print(
            "\nLeft out: the SAC rows with bf16_matmuls=True. This CPU has no fast bfloat16 products (PyTorch's CPU "
            f"capability: {torch.backends.cpu.get_cpu_capability()}), where they run tens of times slower than "
            "float32 (the kernels group's bfloat16 row measures it)."
        )
    print(f"\ncommand: python -m benchmarks.fast_paths {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"CPU: {cpu_description()}")
    print(f"code: {code_version()}")


if __name__ == "__main__":
    main()

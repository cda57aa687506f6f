"""Soft Actor-Critic (Haarnoja et al. 2018, https://arxiv.org/abs/1812.05905) with SB3's API, and
SAC for Discrete actions (Christodoulou 2019, https://arxiv.org/abs/1910.07207), which SB3 lacks."""

from __future__ import annotations

import contextlib
import copy
import math
import numbers
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import DictReplayBuffer as SB3DictReplayBuffer
from stable_baselines3.common.buffers import NStepReplayBuffer as SB3NStepReplayBuffer
from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.noise import ActionNoise, VectorizedActionNoise
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.type_aliases import RolloutReturn, TrainFreq, TrainFrequencyUnit
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer as SB3HerReplayBuffer

from covey import serialization
from covey.agents.base import (
    BaseAgent,
    FlatParameters,
    PolicyAliases,
    Schedule,
    has_hooks,
    merge_parameter_groups,
    outside_inference_mode,
    require,
    require_numbers,
    set_train_mode,
)
from covey.agents.sb3_policy import sb3_policy_class
from covey.buffers.finite import check_discrete_observations, check_finite, check_terminal_observation
from covey.buffers.her import HER_KWARGS, HerReplayBuffer, goal_strategy
from covey.buffers.replay import ReplayBatch, ReplayBuffer, file_layout, file_returns, read_buffer_file
from covey.networks import linear
from covey.networks.actor_critic import PolicyConfig, acting_mode, build_sac_networks, policy_kwargs_dict
from covey.networks.distributions import SquashedGaussianHead, SquashedStateDependentHead
from covey.networks.ema import CriticEMA, ema_regularizer, polyak_update
from covey.networks.mlp import ManualMLP
from covey.networks.obs import batch_to_tensor
from covey.networks.policies import SACPolicy
from covey.networks.sb3_names import is_sb3, translate_groups
from covey.networks.twohot import ScalarHead
from covey.noise import noise_from_json, noise_to_json
from covey.spaces import check_finite_bounds
from covey.warning import warn_user
from covey.wrappers.vec_env import VecImageLayout


@dataclass
class SACConfig:
    """SAC's hyperparameters, named and defaulted as in Stable-Baselines3."""

    learning_rate: Schedule = 3e-4
    """Adam step size of actor, critics and temperature (or a schedule of the remaining progress)."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions (all envs together)."""
    learning_starts: int = 100
    """Env steps of uniformly random actions before learning starts."""
    batch_size: int = 256
    """Minibatch size of each gradient step."""
    tau: float = 0.005
    """Polyak coefficient of the target critics: target <- (1 - tau) * target + tau * online."""
    gamma: float = 0.99
    """Discount factor."""
    train_freq: Any = 1
    """Train every n steps (int or (n, "step")) or every n episodes ((n, "episode"))."""
    gradient_steps: int = 1
    """Gradient steps after each collection; -1: as many as env steps were collected."""
    optimize_memory_usage: bool = False
    """Store each observation once in the replay buffer (next observations are read from the next row)."""
    ent_coef: str | float = "auto"
    """Entropy temperature: a float, "auto" (learned from 1.0) or "auto_<init>"."""
    target_update_interval: int = 1
    """Update the target critics every this many gradient steps."""
    target_entropy: str | float = "auto"
    """Target entropy for the learned temperature; "auto": -dim(A) (Box) or 0.5 * log|A| (Discrete)."""
    stats_window_size: int = 100
    """Episodes averaged for rollout/ep_rew_mean."""
    bf16_matmuls: bool = False
    """covey's opt-in: the gradient steps multiply in bfloat16 (parameters, optimizer and losses stay float32).
    With hand-written gradients (:class:`ManualSACStep`) the large layers' products do, each rounded to
    bfloat16 as autocast rounds them; otherwise the networks run under bfloat16 autocast, with float32
    outputs. Faster gradient steps on a CPU with bfloat16 units (where a 256x256 product takes half the
    float32 time or less), at bfloat16's 8-bit mantissa in those layers. Many times slower on a CPU whose
    PyTorch has no fast bfloat16 products (AVX2 x86 CPUs), and slower where oneDNN has no bfloat16 kernel
    faster than float32's (an Intel Xeon whose virtual machine showed AVX-512 BF16 without AMX): ``learn``
    warns in both cases (it times one product for the second)."""
    use_sde: bool = False
    """Generalized state-dependent exploration for Box actions (the noise a linear function of the state)."""
    sde_sample_freq: int = -1
    """With use_sde: draw new exploration matrices every this many steps within a collection (-1, or any value
    < 1: once per collection, which with ``train_freq=1`` is every step, as in SB3)."""
    use_sde_at_warmup: bool = False
    """With use_sde: before ``learning_starts``, act with the policy's state-dependent noise instead of
    uniformly random actions."""
    n_steps: int = 1
    """n-step returns: each sample's reward sums up to this many discounted rewards of its episode, and its
    target bootstraps from the observation after the last of them, discounted by ``gamma ** steps summed``."""

    def __post_init__(self) -> None:
        require_numbers(self, "SAC")
        # SB3 takes float(...) of both, so NumPy scalars (-np.prod(shape)) and number strings ("0.1") work there
        self.ent_coef = _float_unless_auto(self.ent_coef)
        self.target_entropy = _float_unless_auto(self.target_entropy)

        def need(ok: bool, name: str, rule: str) -> None:
            require(ok, "SAC", name, getattr(self, name), rule)

        need(self.buffer_size >= 1, "buffer_size", "it must be >= 1")
        need(self.learning_starts >= 0, "learning_starts", "it must be >= 0")
        need(self.batch_size >= 1, "batch_size", "it must be >= 1")
        need(0.0 < self.tau <= 1.0, "tau", "it must lie in (0, 1]")
        need(0.0 <= self.gamma <= 1.0, "gamma", "it must lie in [0, 1]")
        need(self.target_update_interval >= 1, "target_update_interval", "it must be >= 1")
        need(isinstance(self.n_steps, (int, np.integer)) and self.n_steps >= 1, "n_steps", "it must be an int >= 1")
        need(
            self.n_steps == 1 or not self.optimize_memory_usage,
            "n_steps",
            "n-step returns need each step's next observation stored: use optimize_memory_usage=False",
        )
        need(isinstance(self.sde_sample_freq, (int, np.integer)), "sde_sample_freq", "it must be an int")
        need(callable(self.learning_rate) or self.learning_rate >= 0, "learning_rate", "it must be >= 0 or a schedule")
        ok = isinstance(self.ent_coef, float) and 0 <= self.ent_coef < math.inf
        if isinstance(self.ent_coef, str) and self.ent_coef.startswith("auto"):
            tail = self.ent_coef[len("auto") :]
            ok = tail == "" or (tail.startswith("_") and _is_positive_float(tail[1:]))
        need(ok, "ent_coef", 'it must be a float >= 0, "auto" or "auto_<initial value>" such as "auto_0.1"')
        need(
            self.target_entropy == "auto"
            or (isinstance(self.target_entropy, float) and math.isfinite(self.target_entropy)),
            "target_entropy",
            'it must be "auto" or a finite float',
        )
        need(isinstance(self.bf16_matmuls, bool), "bf16_matmuls", "it must be True or False")
        self.train_freq = _train_freq(self.train_freq)


def _float_unless_auto(value: Any) -> Any:
    """``value`` as a Python float where it is a number (NumPy's too) or a number's text; as it is otherwise
    ("auto", "auto_0.1", a bool or anything else, which the checks name)."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, str) and value.startswith("auto")):
        return value
    if isinstance(value, (numbers.Real, str)):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _is_positive_float(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


def _train_freq(value: Any) -> TrainFreq:
    """``train_freq`` as SB3 takes it (an int: steps; ``(n, "step" | "episode")``; SB3's ``TrainFreq``) as SB3's
    ``TrainFreq(frequency, TrainFrequencyUnit)``."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value, "step")
    ok = isinstance(value, (tuple, list)) and len(value) == 2
    if ok:
        n, unit = value
        ok = isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1
        try:
            unit = TrainFrequencyUnit(unit)
        except ValueError:
            ok = False
    if not ok:
        raise ValueError(f'SAC: train_freq={value!r} is invalid: use an int >= 1 or (n, "step") / (n, "episode").')
    return TrainFreq(int(n), unit)


# ---------------------------------------------------------------------------- the maths, as pure functions
def soft_q_target(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    next_q: torch.Tensor,
    next_log_prob: torch.Tensor,
    ent_coef: torch.Tensor | float,
    gamma: float,
) -> torch.Tensor:
    """``r + gamma * (1 - terminated) * (min_i Q_i'(s', a') - alpha * log pi(a'|s'))`` for Box actions.

    ``next_q`` is ``(n_critics, B)`` from the target critics at the policy's next action.
    """
    next_v = next_q.min(dim=0).values - ent_coef * next_log_prob
    # Only a true terminal has no future; truncated transitions were stored with terminated = 0.
    return rewards + gamma * (1.0 - terminated) * next_v


def discrete_soft_q_target(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    next_q: torch.Tensor,
    next_log_probs: torch.Tensor,
    ent_coef: torch.Tensor | float,
    gamma: float,
) -> torch.Tensor:
    """The Discrete-action target: the exact expectation over next actions instead of a sample.

    ``next_q`` is ``(n_critics, B, n_actions)``, ``next_log_probs`` ``(B, n_actions)``.
    """
    probs = next_log_probs.exp()
    next_v = (probs * (next_q.min(dim=0).values - ent_coef * next_log_probs)).sum(-1)
    return rewards + gamma * (1.0 - terminated) * next_v


def critic_loss(current_q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``0.5 * sum_i mean((Q_i - target)^2)`` over the ``n_critics`` rows of ``current_q`` ``(n, B)``."""
    return 0.5 * (current_q - target.detach()).pow(2).mean(dim=1).sum()


def actor_loss(q_pi: torch.Tensor, log_prob: torch.Tensor, ent_coef: torch.Tensor | float) -> torch.Tensor:
    """``mean(alpha * log pi(a|s) - min_i Q_i(s, a))`` with ``a`` a reparameterized sample (Box)."""
    return (ent_coef * log_prob - q_pi.min(dim=0).values).mean()


def discrete_actor_loss(q: torch.Tensor, log_probs: torch.Tensor, ent_coef: torch.Tensor | float) -> torch.Tensor:
    """``mean(sum_a pi(a|s) * (alpha * log pi(a|s) - min_i Q_i(s, a)))`` (exact expectation)."""
    return (log_probs.exp() * (ent_coef * log_probs - q.min(dim=0).values)).sum(-1).mean()


def q_diagnostics(current_q: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """The critics' logged diagnostics, averaged over gradient steps: ``current_q`` ``(steps, n_critics, B)``
    against ``target`` ``(steps, B)``. Q mean and std, mean |TD error| and ``1 - Var(target - Q) / Var(target)``
    (over the batch and the critics)."""
    error = target[:, None] - current_q
    steps = current_q.shape[0]
    explained = 1.0 - error.reshape(steps, -1).var(dim=1) / target.var(dim=1).clamp_min(1e-8)
    return {
        "q_mean": current_q.reshape(steps, -1).mean(dim=1).mean(),
        "q_std": current_q.reshape(steps, -1).std(dim=1).mean(),
        "td_error_abs": error.abs().mean(),
        "explained_variance": explained.mean(),
    }


def temperature_loss(log_ent_coef: torch.Tensor, log_prob: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """``-mean(log_alpha * (log pi + target_entropy))``: raises alpha while entropy is below target.

    For Discrete actions pass ``log_prob = sum_a pi(a) log pi(a)`` (minus the entropy) per state.
    """
    return -(log_ent_coef * (log_prob + target_entropy).detach()).mean()


# ---------------------------------------------------------------------------- hand-written gradients
class ManualSACStep:
    """SAC's gradient step for Box actions and MLP networks, with hand-written gradients.

    The same losses (:func:`temperature_loss`, :func:`soft_q_target`, :func:`critic_loss`, :func:`actor_loss`),
    in the same order, with the same random draws and optimizer steps as the autograd step
    (:meth:`SAC._gradient_step`), but each network runs as a :class:`~covey.networks.mlp.ManualMLP` that writes
    its gradients straight into the optimizer's flat gradient buffer: no autograd graph, no module calls, and
    the critics in the actor's loss are differentiated with respect to the action only.

    It applies (:meth:`applies`) to Box actions (with or without ``use_sde``), weight-free encoders (``MlpPolicy``
    on vector observations), ``Linear`` + ReLU/Tanh trunks, the scalar value head and no critic EMA; SAC uses
    autograd otherwise. With ``bf16``, the large layers' products (the 256x256 ones of SB3's default networks)
    run in bfloat16 (:class:`~covey.networks.mlp.ManualMLP`), the rest in float32.
    """

    def __init__(self, actor: Any, critic: Any, critic_target: Any, bf16: bool = False) -> None:
        self.actor, self.critic, self.critic_target = actor, critic, critic_target
        self.actor_net = ManualMLP(actor.trunk, actor.head.proj, bf16=bf16)
        self.critic_nets = [ManualMLP(q.trunk, q.head.proj, bf16=bf16) for q in critic.qs]
        self.target_nets = [ManualMLP(q.trunk, q.head.proj, bf16=bf16) for q in critic_target.qs]
        self.sde = isinstance(actor.head, SquashedStateDependentHead)

    @staticmethod
    def applies(agent: SAC) -> bool:
        """Whether ``agent``'s networks and settings are of the supported kind, and its optimizers step exactly
        the parameters that the hand-written gradients cover."""
        actor, critic = agent.actor, agent.critic
        if agent.discrete or agent.critic_ema is not None or actor.memory is not None:
            return False
        heads = (SquashedGaussianHead, SquashedStateDependentHead)
        if not isinstance(actor.head, heads) or not ManualMLP.supports(actor.trunk, actor.head.proj):
            return False
        if any(True for _ in actor.encoder.parameters()) or any(True for _ in critic.encoder.parameters()):
            return False
        for q in (*critic.qs, *agent.critic_target.qs):
            if type(q.head) is not ScalarHead or q.head.n_outputs != 1 or not ManualMLP.supports(q.trunk, q.head.proj):
                return False

        def covers(optimizer: torch.optim.Optimizer, module: torch.nn.Module) -> bool:
            params = optimizer.flat_parameters.params
            return {id(p) for p in params} == {id(p) for p in module.parameters()}

        return covers(agent.actor_optimizer, actor) and covers(agent.critic_optimizer, critic)

    def bind(self) -> None:
        """Read the parameters' ``.grad`` tensors again (before every ``train()`` call: they may be replaced), and
        which products go to oneDNN (``covey.networks.linear.ONEDNN``), for the target critics too."""
        for net in (self.actor_net, *self.critic_nets, *self.target_nets):
            net.bind()

    @torch.no_grad()
    def step(self, agent: SAC, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """One update of temperature, critics and actor: what :meth:`SAC._gradient_step` returns. With ``bf16``
        each network's weights are rounded to bfloat16 once for the products that use them unchanged (the
        critics' again after their optimizer step)."""
        nets = (self.actor_net, *self.critic_nets, *self.target_nets)
        for net in nets:
            net.hold_weights16()
        try:
            return self._step(agent, batch)
        finally:
            for net in nets:
                net.release_weights16()

    def _step(self, agent: SAC, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
        head, size = self.actor.head, batch.actions.shape[0]
        if self.sde:  # as the autograd step: a new exploration matrix, whose draw the gradient of log_std needs
            head.reset_noise(differentiable=True)
        obs = self.actor.encoder(batch.observations)
        params, h_pi = self.actor_net.forward(obs)
        action, log_prob, terms = self._sample(params, h_pi)
        ent_coef = agent._ent_coef()
        stats: dict[str, torch.Tensor] = {"ent_coef": ent_coef.reshape(())}
        if agent.log_ent_coef is not None:
            stats["ent_coef_loss"] = temperature_loss(agent.log_ent_coef, log_prob, agent.target_entropy)
            flat = agent.ent_coef_optimizer.flat_parameters
            flat.grad.copy_((log_prob + agent.target_entropy).mean().neg())  # d/d log(alpha)
            flat.step(agent.ent_coef_optimizer)

        # The critics, against the target critics at the policy's next action.
        next_params, next_inputs = self.actor_net.forward(self.actor.encoder(batch.next_observations))
        next_action, next_log_prob, _ = self._sample(next_params, next_inputs)
        next_x = torch.cat([self.critic_target.encoder(batch.next_observations), next_action], dim=-1)
        next_q = torch.stack([net.forward(next_x)[0].view(-1) for net in self.target_nets])  # (n_critics, B)
        target = soft_q_target(
            batch.rewards, batch.terminated, next_q, next_log_prob, ent_coef, discount(batch, agent.config.gamma)
        )
        features = self.critic.encoder(batch.observations)
        x = torch.cat([features, batch.actions], dim=-1)
        outputs = [net.forward(x) for net in self.critic_nets]
        current_q = torch.stack([q.view(-1) for q, _ in outputs])  # (n_critics, B)
        stats["critic_loss"] = critic_loss(current_q, target)
        grad_q = (current_q - target).div_(size)  # d/dQ_i of 0.5 * mean((Q_i - target)^2)
        for net, (_, inputs), grad in zip(self.critic_nets, outputs, grad_q):
            net.backward(inputs, grad.unsqueeze(-1))
        agent.critic_optimizer.flat_parameters.step(agent.critic_optimizer)
        for net in self.critic_nets:  # their bfloat16 copies of the weights before the step are stale
            net.hold_weights16()

        # The actor, against the updated critics; the critics pass gradients to the action only.
        x = torch.cat([features, action], dim=-1)
        outputs = [net.forward(x) for net in self.critic_nets]
        q_pi = torch.stack([q.view(-1) for q, _ in outputs])  # (n_critics, B)
        stats["actor_loss"] = actor_loss(q_pi, log_prob, ent_coef)
        lowest = q_pi.min(dim=0).indices  # min's gradient goes to the critic it took, as autograd's does
        grad_action = None
        for i, (net, (_, inputs)) in enumerate(zip(self.critic_nets, outputs)):
            grad = (lowest == i).to(q_pi.dtype).mul_(-1.0 / size).unsqueeze(-1)  # d/dQ_i of -mean(min_i Q_i)
            part = net.input_grad(inputs, grad, start=features.shape[1])
            grad_action = part if grad_action is None else grad_action.add_(part)
        grad_log_prob = (ent_coef / size).expand(size)  # d/d log pi of mean(alpha * log pi)
        if self.sde:  # the head reads the latent too, and writes log_std's gradient itself
            grad_params, grad_latent = head.manual_grad(terms, grad_action, grad_log_prob)
            self.actor_net.backward(h_pi, grad_params, grad_latent)
        else:
            self.actor_net.backward(h_pi, head.manual_grad(terms, grad_action, grad_log_prob))
        agent.actor_optimizer.flat_parameters.step(agent.actor_optimizer)
        return stats, (current_q, target)

    def _sample(self, params: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """The head's reparameterized sample from the actor's output ``params`` and its layers' ``inputs``
        (gSDE's head reads the latent, the last of them)."""
        if self.sde:
            return self.actor.head.manual_rsample(params, inputs[-1])
        return self.actor.head.manual_rsample(params)


# ---------------------------------------------------------------------------- the agent
def check_replay_buffer_args(
    replay_buffer_class: type | str | None, replay_buffer_kwargs: dict | None, n_steps: Any, gamma: Any
) -> tuple[bool, Any, dict | None]:
    """Accept what SB3's own replay buffers do, which covey's buffers do too (uniform sampling, Dict
    observations, time-limit truncations bootstrapped unless ``handle_timeout_termination=False`` makes them
    terminal, n-step returns, hindsight experience replay); refuse the rest with what to change. Returns
    ``handle_timeout_termination``, the n-step length to use (``n_steps``, or an ``NStepReplayBuffer``'s own: SB3
    then ignores ``n_steps``) and, for ``HerReplayBuffer`` (the class, or its name as a model file keeps it),
    :class:`~covey.buffers.her.HerReplayBuffer`'s settings."""
    # covey's own buffer classes stand for SB3's, as the name does in a model file
    replay_buffer_class = {"HerReplayBuffer": SB3HerReplayBuffer, HerReplayBuffer: SB3HerReplayBuffer}.get(
        replay_buffer_class, replay_buffer_class
    )
    if replay_buffer_class is ReplayBuffer:
        replay_buffer_class = SB3ReplayBuffer
    own = (SB3ReplayBuffer, SB3DictReplayBuffer, SB3NStepReplayBuffer, SB3HerReplayBuffer)
    if replay_buffer_class is not None and replay_buffer_class not in own:
        name = getattr(replay_buffer_class, "__name__", repr(replay_buffer_class))
        raise NotImplementedError(
            f"replay_buffer_class={name} (a custom replay buffer) is not supported: covey's SAC samples its own "
            "replay buffer as SB3's ReplayBuffer, DictReplayBuffer, NStepReplayBuffer and HerReplayBuffer do. "
            "Remove replay_buffer_class."
        )
    kwargs = dict(replay_buffer_kwargs or {})
    handle_timeouts = kwargs.pop("handle_timeout_termination", True)
    if not isinstance(handle_timeouts, (bool, np.bool_)):
        raise ValueError(
            f"replay_buffer_kwargs: handle_timeout_termination={handle_timeouts!r} is invalid: use True (a time-limit "
            "truncation keeps the bootstrap from the final observation, the default) or False (it is terminal)."
        )
    if replay_buffer_class is not None:
        if n_steps != 1:  # as SB3 warns: a replay buffer class given sets the returns itself
            warn_user(
                f"n_steps={n_steps} is ignored because replay_buffer_class={replay_buffer_class.__name__} was "
                "given; pass n_steps alone (without replay_buffer_class) for n-step returns."
            )
        n_steps = 1
    her = None
    if replay_buffer_class is SB3HerReplayBuffer:
        her = {key: kwargs.pop(key) for key in HER_KWARGS if key in kwargs}
        kwargs.pop("env", None)  # SB3 passes the model's env itself; so does covey
        if "goal_selection_strategy" in her:
            her["goal_selection_strategy"] = goal_strategy(her["goal_selection_strategy"])
    if replay_buffer_class is SB3NStepReplayBuffer:
        n_steps = kwargs.pop("n_steps", 3)  # SB3's NStepReplayBuffer defaults
        given = "gamma" in kwargs
        buffer_gamma = kwargs.pop("gamma", 0.99)
        if buffer_gamma != gamma:
            which = f"replay_buffer_kwargs gamma={buffer_gamma}" if given else "NStepReplayBuffer's own gamma=0.99"
            raise NotImplementedError(
                f"{which} (its n-step returns' discount, where replay_buffer_kwargs gives none) differs from SAC's "
                f"gamma={gamma}: covey's n-step returns discount with SAC's gamma. Pass n_steps={n_steps} and the "
                "gamma you mean to SAC instead (without replay_buffer_class)."
            )
    if kwargs:
        raise NotImplementedError(
            f"replay_buffer_kwargs {sorted(kwargs)} are not supported by covey's replay buffer (it takes "
            "handle_timeout_termination; n_steps and gamma for NStepReplayBuffer; n_sampled_goal, "
            "goal_selection_strategy and copy_info_dict for HerReplayBuffer; optimize_memory_usage is SAC's own "
            "argument). Remove them."
        )
    return bool(handle_timeouts), n_steps, her


def discount(batch: ReplayBatch, gamma: float) -> torch.Tensor | float:
    """The bootstrap discount of each sample: ``gamma``, or ``gamma ** steps summed`` with n-step returns."""
    return gamma if batch.discounts is None else batch.discounts


def check_sac_actions(space: spaces.Space) -> None:
    """Raise where SAC cannot act in ``space``: MultiDiscrete or MultiBinary actions, a Box of integers (SB3's SAC
    takes one, and its replay buffer stores the float actions in the space's dtype, cut to -1, 0 or 1), infinite
    bounds or bounds that leave no room, a single Discrete action."""
    if isinstance(space, spaces.MultiDiscrete | spaces.MultiBinary):
        raise NotImplementedError(
            f"SAC does not support the action space {space}: it supports Box (continuous) and "
            "Discrete actions. Use PPO for MultiDiscrete and MultiBinary actions."
        )
    check_finite_bounds(space, "SAC")
    if isinstance(space, spaces.Box) and not np.issubdtype(space.dtype, np.floating):
        raise ValueError(
            f"SAC's Box actions are continuous, the action space is {space.dtype} ({space}). Give the env a float "
            "Box and round the actions in an ActionWrapper, or use Discrete / MultiDiscrete actions (SAC takes "
            "Discrete; PPO both)."
        )
    if isinstance(space, spaces.Box) and np.any(np.asarray(space.high) <= np.asarray(space.low)):
        fixed = np.flatnonzero(np.asarray(space.high) <= np.asarray(space.low)).tolist()
        raise ValueError(
            f"SAC scales its actions into the Box bounds, and {space} has high <= low at (flat) index "
            f"{fixed}: an action that cannot vary. Leave that dimension out of the action space (an "
            "ActionWrapper can fill it in)."
        )
    if isinstance(space, spaces.Discrete) and space.n < 2:
        raise ValueError(
            f"SAC got {space}: a single action, nothing to choose or learn. Give the env two actions or more."
        )


class SAC(BaseAgent):
    """Soft Actor-Critic with the Stable-Baselines3 interface, for Box and Discrete actions.

    Constructor arguments, defaults, ``learn``/``predict``/``save``/``load``, callbacks and logger keys
    follow ``stable_baselines3.SAC``. ``model.actor`` is the actor; ``model.critic`` and
    ``model.critic_target`` hold the ``n_critics`` Q networks; ``model.policy`` holds all three with SB3's
    ``SACPolicy`` calls (:class:`~covey.networks.policies.SACPolicy`); the temperature lives with the agent. A
    user's subclass of SB3's ``SACPolicy`` as ``policy`` is built and trained through SB3's calls instead
    (:mod:`covey.agents.sb3_policy`): ``model.policy`` is then the SB3 policy, and ``model.actor``, ``model.critic``
    and ``model.critic_target`` its modules.

    Each argument is described in :class:`SACConfig`. covey's one addition, after SB3's arguments:
    ``bf16_matmuls`` (False) multiplies the large layers of each gradient step in bfloat16, which pays on CPUs
    with bfloat16 units (on x86, AVX-512 with its bfloat16 instructions) and is tens of times slower where
    PyTorch has none (``learn`` warns); parameters, optimizers and losses stay float32.

    >>> from covey import SAC
    >>> model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=50, seed=0).learn(100)
    >>> model.num_timesteps
    100
    """

    agent_name = "SAC"
    _sb3_optimizers = ("actor.optimizer", "critic.optimizer", "ent_coef_optimizer")
    has_memory = False
    supported_action_spaces = (spaces.Box, spaces.Discrete)
    config_class = SACConfig
    policy_aliases = PolicyAliases("covey.sac.policies")
    own_attributes = frozenset({"target_entropy"})  # as in SB3, the number in force once set up ("auto" resolved)
    built_from = {
        "buffer_size": "the replay buffer",
        "optimize_memory_usage": "the replay buffer",
        "n_steps": "the replay buffer's n-step returns",
        "use_sde": "the actor's action distribution",
        "ent_coef": "the entropy temperature (learned, or fixed: model.ent_coef_tensor = torch.tensor(value) "
        "changes a fixed one, as in SB3)",
        "bf16_matmuls": "the gradient step",
    }
    manual_gradients: ClassVar[bool] = True
    """Take gradient steps with :class:`ManualSACStep` where it applies (set ``SAC.manual_gradients = False``
    before building a model to use autograd for every network)."""

    def __init__(
        self,
        policy: str,
        env: Any,
        learning_rate: Schedule = 3e-4,
        buffer_size: int = 1_000_000,
        learning_starts: int = 100,
        batch_size: int = 256,
        tau: float = 0.005,
        gamma: float = 0.99,
        train_freq: int | tuple[int, str] = 1,
        gradient_steps: int = 1,
        action_noise: Any = None,
        replay_buffer_class: type | None = None,
        replay_buffer_kwargs: dict | None = None,
        optimize_memory_usage: bool = False,
        n_steps: int = 1,
        ent_coef: str | float = "auto",
        target_update_interval: int = 1,
        target_entropy: str | float = "auto",
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        use_sde_at_warmup: bool = False,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: torch.device | str = "auto",
        bf16_matmuls: bool = False,
        _init_setup_model: bool = True,
    ) -> None:
        self._handle_timeouts, n_steps, self._her = check_replay_buffer_args(
            replay_buffer_class, replay_buffer_kwargs, n_steps, gamma
        )
        if self._her is not None:
            replay_buffer_class = SB3HerReplayBuffer
            if optimize_memory_usage:
                raise NotImplementedError(
                    "HerReplayBuffer stores each step's next observation: use optimize_memory_usage=False."
                )
        self.replay_buffer_class = replay_buffer_class
        self.replay_buffer_kwargs = dict(replay_buffer_kwargs or {})
        self.config = SACConfig(
            learning_rate=learning_rate,
            buffer_size=buffer_size,
            learning_starts=learning_starts,
            batch_size=batch_size,
            tau=tau,
            gamma=gamma,
            train_freq=train_freq,
            gradient_steps=gradient_steps,
            optimize_memory_usage=optimize_memory_usage,
            ent_coef=ent_coef,
            target_update_interval=target_update_interval,
            target_entropy=target_entropy,
            stats_window_size=stats_window_size,
            bf16_matmuls=bf16_matmuls,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            use_sde_at_warmup=use_sde_at_warmup,
            n_steps=n_steps,
        )
        kwargs = policy_kwargs_dict(policy_kwargs)
        # SB3's off-policy agents set the policy's use_sde from their own argument, silently
        if kwargs.pop("use_sde", False) and not use_sde:
            warn_user(
                "policy_kwargs use_sde=True is not read: SAC's own use_sde argument decides (False here), as in SB3. "
                "Pass use_sde=True to SAC for state-dependent exploration."
            )
        self._sb3_policy_class = sb3_policy_class(policy, "SAC")
        if self._sb3_policy_class is not None:
            # the class takes policy_kwargs itself; covey's own networks and their settings are not built
            self.policy_config, policy, policy_kwargs = PolicyConfig(), "MlpPolicy", kwargs
            if bf16_matmuls:
                raise ValueError(
                    f"bf16_matmuls=True rounds the products of covey's own networks; {self._sb3_policy_class.__name__} "
                    "is an SB3 policy class, whose modules SAC calls as they are. Remove bf16_matmuls."
                )
        else:
            self.policy_config = PolicyConfig.from_kwargs(
                kwargs, activation_fn=torch.nn.ReLU, ortho_init=False, share_features_extractor=False, log_std_init=-3.0
            )
        self.policy_config.use_sde = bool(use_sde)
        contrib_keys = getattr(self.policy_config, "_recurrent_ppo_keys", [])
        if self.policy_config.memory is not None or contrib_keys:
            asked = self.policy_config.memory is not None and not getattr(
                self.policy_config, "_memory_from_lstm_hidden_size", False
            )
            named = ", ".join(["memory"] * asked + contrib_keys)
            raise ValueError(
                f"policy_kwargs {named} {'is not a SAC setting' if named.count(',') == 0 else 'are not SAC settings'}: "
                "SAC has no recurrent memory. Remove it, or use PPO or POCA for a policy with memory; stacked frames "
                "(SB3's VecFrameStack) give SAC the recent past."
            )
        if self.policy_config.squash_output:
            raise ValueError(
                "policy_kwargs squash_output is not a SAC setting: SAC always squashes its Box actions into the "
                "bounds (tanh, then rescaled). Remove squash_output."
            )
        if action_noise is not None and not isinstance(action_noise, ActionNoise):
            raise ValueError(
                f"action_noise={action_noise!r} is invalid: pass an SB3 ActionNoise, e.g. NormalActionNoise(mean="
                "np.zeros(n_actions), sigma=0.1 * np.ones(n_actions)) from stable_baselines3.common.noise, or None."
            )
        self.action_noise = action_noise
        """SB3's exploration noise (a ``stable_baselines3.common.noise.ActionNoise``) added to Box actions in
        [-1, 1] while collecting, as in SB3. Saved with the model as settings where it is SB3's Normal or
        Ornstein-Uhlenbeck noise (or a VectorizedActionNoise of one); ``load(path, action_noise=...)`` gives any
        other back."""
        self._last_original_obs = None  # behind a VecNormalize: the original of _last_obs
        super().__init__(
            policy, env, learning_rate, policy_kwargs, stats_window_size, tensorboard_log, verbose, device, seed
        )
        self.replay_buffer: ReplayBuffer | None = None
        if _init_setup_model:
            self._setup_model()

    def _attach_env(self, env) -> None:
        if self._sb3_policy_class is not None and not isinstance(env.action_space, spaces.Box):
            raise ValueError(
                f"{self._sb3_policy_class.__name__} is an SB3 SACPolicy, which acts in Box spaces only (SB3's SAC has "
                f"no discrete actions); the env's are {env.action_space}. Use a policy name for covey's discrete SAC."
            )
        check_sac_actions(env.action_space)
        if self.action_noise is not None and not isinstance(env.action_space, spaces.Box):
            raise ValueError(
                f"action_noise applies to Box actions, the env's are {env.action_space}: SAC explores Discrete "
                "actions by sampling its policy. Remove action_noise."
            )
        base = getattr(self.action_noise, "base_noise", self.action_noise)
        n_actions = int(np.prod(env.action_space.shape)) if isinstance(env.action_space, spaces.Box) else 0
        shapes = ((), (1,), (n_actions,), env.action_space.shape if n_actions else ())
        for name, attribute in (("mean", "_mu"), ("sigma", "_sigma")):  # SB3's Normal and Ornstein-Uhlenbeck noises
            value = getattr(base, attribute, None)
            if value is not None and n_actions and np.shape(value) not in shapes:
                raise ValueError(
                    f"action_noise's {name} has shape {np.shape(value)}, the env's actions {n_actions} numbers "
                    f"({env.action_space}): give the noise {n_actions} means and sigmas, e.g. NormalActionNoise("
                    f"mean=np.zeros({n_actions}), sigma=0.1 * np.ones({n_actions}))."
                )
        super()._attach_env(env)

    def _setup_model(self) -> None:
        self._require_spaces()
        check_sac_actions(self.action_space)  # a loaded file's too, without an env
        self.set_random_seed(self.seed)
        self.discrete = isinstance(self.action_space, spaces.Discrete)
        if self._sb3_policy_class is not None:
            self._setup_sb3_policy()
            self._setup_temperature()
            self._setup_replay_buffer()
            return
        self.actor, self.critic = build_sac_networks(
            self.policy_name, self.observation_space, self.action_space, self.policy_config
        )
        self.critic_target = build_sac_networks(
            self.policy_name, self.observation_space, self.action_space, self.policy_config
        )[1]
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.requires_grad_(False)
        self.critic_target.train(False)  # as SB3's: targets run in evaluation mode (dropout off, batch norm frozen)
        pc = self.policy_config
        for module in (self.actor, self.critic, self.critic_target):
            module.to(self.device)
        self.critic_ema = CriticEMA(self.critic, pc.critic_ema_decay) if pc.critic_ema_decay is not None else None
        self.policy = SACPolicy(self.actor, self.critic, self.critic_target, self)  # SB3's model.policy
        self.policy.config = self.policy_config
        # The critics' optimizer trains their own parameters; a shared encoder (share_features_extractor) is the
        # actor's to train, and the target critics' copy of it follows it by Polyak averaging, as SB3's does.
        shared = {id(p) for p in self.critic.encoder.parameters()} if self.critic.share_features_extractor else set()
        targets = dict(self.critic_target.named_parameters())
        own = [(name, p) for name, p in self.critic.named_parameters() if id(p) not in shared]
        self._critic_params = [p for _, p in own]
        self._target_params = [targets[name] for name, _ in own]
        self._shared_polyak = [  # (target copies, the actor's encoder parameters)
            [targets[name] for name, p in self.critic.named_parameters() if id(p) in shared],
            [p for p in self.critic.parameters() if id(p) in shared],
        ]
        self._running_stats = self._target_running_stats()
        self._setup_temperature()
        self.actor.optimizer = self.actor_optimizer = self._make_optimizer(list(self.actor.parameters()))
        self.policy.optimizer = self.actor_optimizer
        self.critic.optimizer = self.critic_optimizer = self._make_optimizer(self._critic_params)
        # The target critics in one flat buffer with the critics' layout: the Polyak update is one lerp.
        self._target_flat = FlatParameters(self._target_params, with_grad=False)
        self._manual: ManualSACStep | None = None
        if self.manual_gradients and ManualSACStep.applies(self):
            self._manual = ManualSACStep(self.actor, self.critic, self.critic_target, bf16=self.config.bf16_matmuls)
        self._setup_replay_buffer()

    def _setup_sb3_policy(self) -> None:
        """A user's SB3 policy class (:mod:`covey.agents.sb3_policy`): ``model.policy`` is the SB3 policy, its
        ``actor``, ``critic`` and ``critic_target`` the model's, trained as SB3's SAC trains them."""
        self.policy = self._build_sb3_policy()
        self.actor, self.critic, self.critic_target = self.policy.actor, self.policy.critic, self.policy.critic_target
        self.critic_ema, self._manual = None, None
        self._running_stats = self._target_running_stats()

    @property
    def batch_norm_stats(self) -> list[torch.Tensor]:
        """The critics' batch-norm running statistics (a custom features extractor's), as SB3's SAC lists them."""
        return [stat for _, stat in self._running_stats]

    @property
    def batch_norm_stats_target(self) -> list[torch.Tensor]:
        """The target critics' batch-norm running statistics, in :attr:`batch_norm_stats`' order."""
        return [target for target, _ in self._running_stats]

    def _target_running_stats(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(target's, critic's)`` batch-norm running statistics (a custom features extractor's), which each
        target update copies, as SB3's does: the targets run in evaluation mode and never update their own."""
        target_buffers = dict(self.critic_target.named_buffers())
        return [(target_buffers[name], b) for name, b in self.critic.named_buffers() if "running_" in name]

    @property
    def actor_optimizer(self) -> torch.optim.Optimizer:
        return self.actor.optimizer if self._sb3_policy_class is not None else self._actor_optimizer

    @actor_optimizer.setter
    def actor_optimizer(self, value: torch.optim.Optimizer) -> None:
        self._actor_optimizer = value

    @property
    def critic_optimizer(self) -> torch.optim.Optimizer:
        return self.critic.optimizer if self._sb3_policy_class is not None else self._critic_optimizer

    @critic_optimizer.setter
    def critic_optimizer(self, value: torch.optim.Optimizer) -> None:
        self._critic_optimizer = value

    def _setup_temperature(self) -> None:
        """The entropy target and the temperature: learned (``ent_coef="auto"``, with its Adam) or fixed."""
        cfg = self.config
        if cfg.target_entropy == "auto":
            n = int(self.action_space.n) if self.discrete else int(np.prod(self.action_space.shape))
            # Box: -dim(A). Discrete: half the maximum entropy log|A|, not the 0.98 * log|A| often used, which
            # keeps the policy near uniform on small action sets (e.g. CartPole's 2 actions).
            self.target_entropy = 0.5 * math.log(n) if self.discrete else -float(n)
        else:
            self.target_entropy = float(cfg.target_entropy)
        if isinstance(cfg.ent_coef, str):
            init = float(cfg.ent_coef.split("_")[1]) if "_" in cfg.ent_coef else 1.0
            self.log_ent_coef = torch.tensor([math.log(init)], device=self.device, requires_grad=True)
            # as SB3's: Adam at the learning rate, whatever optimizer policy_kwargs choose for the networks
            self.ent_coef_optimizer = self._make_optimizer([self.log_ent_coef], plain_adam=True)
            self.ent_coef_tensor = None
        else:
            self.log_ent_coef = None
            self.ent_coef_optimizer = None
            # SB3's name: a callback that anneals a fixed temperature assigns model.ent_coef_tensor
            self.ent_coef_tensor = torch.tensor(float(cfg.ent_coef), device=self.device)

    def _setup_replay_buffer(self) -> None:
        cfg = self.config
        if self._her is not None:  # hindsight replay: it asks the env for the rewards of relabeled goals
            self.replay_buffer = HerReplayBuffer(
                cfg.buffer_size,
                self.observation_space,
                self.action_space,
                self.env,
                self.n_envs,
                device=self.device,
                handle_timeout_termination=self._handle_timeouts,
                **self._her,
            )
        else:
            self.replay_buffer = ReplayBuffer(
                cfg.buffer_size,
                self.observation_space,
                self.action_space,
                self.n_envs,
                cfg.optimize_memory_usage,
                self.device,
                n_steps=cfg.n_steps,
                gamma=cfg.gamma,
                handle_timeout_termination=self._handle_timeouts,
            )

    def _networks(self) -> dict[str, torch.nn.Module]:
        if self._sb3_policy_class is not None:
            return {"policy": self.policy}
        networks = {"actor": self.actor, "critic": self.critic, "critic_target": self.critic_target}
        if self.critic_ema is not None:
            networks["critic_ema"] = self.critic_ema.model
        return networks

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        opts = {"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer}
        if self.ent_coef_optimizer is not None:
            opts["ent_coef_optimizer"] = self.ent_coef_optimizer
        return opts

    def _parameters_outside_networks(self) -> dict[str, torch.Tensor]:
        temperature = getattr(self, "log_ent_coef", None)
        return {"log_ent_coef": temperature} if temperature is not None else {}

    def _flat_parameters(self) -> list[FlatParameters]:
        if self._sb3_policy_class is not None:
            return super()._flat_parameters()
        return [*super()._flat_parameters(), self._target_flat]

    def _watched_flats(self) -> list[FlatParameters]:
        # The actor's alone, after each train() call (a step of SAC's loop): the actor acts, and critics that
        # diverge make the actor's next gradient step NaN, which the next call finds before the actor acts.
        flat = getattr(self.actor_optimizer, "flat_parameters", None)
        return [flat] if flat is not None and self._sb3_policy_class is None else self._flat_parameters()

    def _optimizer_slots(self) -> list[tuple[str, Any, Any]]:
        if self._sb3_policy_class is not None:
            return []  # the SB3 policy's optimizers are stepped wherever they are, as SB3 steps them
        return [
            ("actor.optimizer", self.actor.optimizer, self.actor_optimizer),
            ("policy.optimizer", self.policy.optimizer, self.actor_optimizer),
            ("critic.optimizer", self.critic.optimizer, self.critic_optimizer),
        ]

    def _parameter_groups(self) -> dict[str, Any]:
        groups = {"policy": self.policy, "actor.optimizer": self.actor_optimizer}  # SB3's names
        groups["critic.optimizer"] = self.critic_optimizer
        if self.ent_coef_optimizer is not None:
            groups["ent_coef_optimizer"] = self.ent_coef_optimizer
            groups["ent_coef"] = _Temperature(self.log_ent_coef)  # covey's; SB3 saves it apart
        if self.critic_ema is not None:
            groups["critic_ema"] = self.critic_ema.model
        return groups

    def get_parameters(self) -> dict[str, dict]:
        params = super().get_parameters()
        if self._sb3_policy_class is not None:
            # SB3's groups only: its set_parameters would take "ent_coef" for its attribute of that name (the
            # coefficient's setting). The file keeps the learned temperature, as SB3's keeps it apart.
            params.pop("ent_coef", None)
        return params

    def _translate_parameter_names(self, params: dict) -> dict:
        if self._sb3_policy_class is not None:
            return params  # SB3's names are the model's own
        renames = {"actor_optimizer": "actor.optimizer", "critic_optimizer": "critic.optimizer"}
        params = merge_parameter_groups(params, "policy", ("actor", "critic", "critic_target"), renames)
        temperature = params.get("ent_coef_optimizer")
        if isinstance(temperature, dict) and not all("betas" in g for g in temperature.get("param_groups", [{}])):
            # Earlier covey files hold the temperature's state in policy_kwargs' optimizer class; it is Adam's now
            warn_user(
                "The learned temperature's optimizer state (ent_coef_optimizer) in these parameters is not an Adam "
                "state; SAC steps the temperature with Adam, as SB3 does, so it starts from a fresh Adam state."
            )
            params = {name: state for name, state in params.items() if name != "ent_coef_optimizer"}
        learned = sorted({"ent_coef", "ent_coef_optimizer"} & set(params))
        if self.ent_coef_optimizer is None and learned:  # e.g. load(path, ent_coef=0.1) of a learned temperature
            warn_user(
                f"These parameters hold a learned temperature ({', '.join(learned)}), which this model does not use: "
                f"its ent_coef is fixed at {self.ent_coef}. Pass ent_coef='auto' to go on learning it."
            )
            params = {name: state for name, state in params.items() if name not in learned}
        params = self._complete_sb3_head(params)
        return translate_groups("SAC", params, self._sb3_optimizers, self._flat_image(), self._sb3_optimizer_state)

    def _complete_sb3_head(self, params: dict) -> dict:
        """SB3's SAC has a mean layer (``actor.mu``) and a log-std layer (``actor.log_std``) where covey's actor
        has one head layer of both: SB3 parameters that give one of them (``exact_match=False``) get the other's
        current values here, so that the head is loaded whole."""
        policy = params.get("policy")
        if not isinstance(policy, dict) or "actor.log_std" in policy or not is_sb3("SAC", policy):
            return params
        if not isinstance(getattr(self.actor, "log_std", None), torch.nn.Module):
            return params  # gSDE's log-std is a matrix of its own, apart from the means' layer
        policy = dict(policy)
        for kind in ("weight", "bias"):
            halves = {f"actor.mu.{kind}": self.actor.mu, f"actor.log_std.{kind}": self.actor.log_std}
            if len(halves.keys() & policy.keys()) == 1:
                for key, layer in halves.items():
                    policy.setdefault(key, getattr(layer, kind).detach().clone())
        return {**params, "policy": policy}

    def _hyperparameters(self) -> dict[str, Any]:
        params = super()._hyperparameters()
        params["train_freq"] = [self.config.train_freq.frequency, self.config.train_freq.unit.value]
        target_entropy = getattr(self, "target_entropy", None)
        if isinstance(target_entropy, (int, float, np.number)) and not isinstance(target_entropy, bool):
            params["target_entropy"] = float(target_entropy)  # the number in force, as SB3 keeps it
        if getattr(self, "log_ent_coef", None) is None and getattr(self, "ent_coef_tensor", None) is not None:
            # a fixed temperature in force (SB3 saves its tensor), the number given where the tensor still holds it
            # (a float32 tensor rounds 0.005 to 0.004999999888)
            in_force, given = float(self.ent_coef_tensor), self.config.ent_coef
            given_holds = isinstance(given, numbers.Real) and float(np.float32(given)) == in_force
            params["ent_coef"] = float(given) if given_holds else in_force
        buffer_kwargs = {} if self._handle_timeouts else {"handle_timeout_termination": False}
        if self._her is not None:  # kept by name: a model file holds no classes
            params["replay_buffer_class"] = "HerReplayBuffer"
            buffer_kwargs.update(self._her)
        if buffer_kwargs:
            params["replay_buffer_kwargs"] = buffer_kwargs
        return params

    def _sb3_arguments(self) -> dict[str, Any]:
        kwargs = super()._sb3_arguments()
        kwargs["train_freq"] = tuple(kwargs["train_freq"])
        if kwargs.get("replay_buffer_class") == "HerReplayBuffer":
            kwargs["replay_buffer_class"] = SB3HerReplayBuffer
        kwargs["action_noise"] = copy.deepcopy(self.action_noise)
        return kwargs

    def _extra_settings(self, excluded: frozenset[str] = frozenset()) -> dict[str, Any]:
        settings = super()._extra_settings(excluded)
        if "action_noise" in excluded:
            return settings
        try:
            settings["action_noise"] = noise_to_json(self.action_noise)
        except TypeError as err:  # a user's own noise: SB3 pickles it, covey's file holds settings only
            warn_user(
                f"save: action_noise is not in the file: {err} (NormalActionNoise, OrnsteinUhlenbeckActionNoise or "
                "a VectorizedActionNoise of one), which covey's file keeps as settings. Pass it to load again: "
                f"{type(self).__name__}.load(path, action_noise=...)."
            )
            settings["unread"] = ["action_noise"]
        return settings

    @classmethod
    def _saved_arguments(cls, name: str, settings: dict[str, Any], given: set[str]) -> dict[str, Any]:
        if "action_noise" in given:
            return {"action_noise": None}  # custom_objects' or the keyword's stands for it
        try:
            return {"action_noise": noise_from_json(settings.get("action_noise"))}
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise serialization.ModelFileError(
                f"{name} holds an action_noise covey cannot read ({err!r}): the file is damaged, or was edited. "
                f"Pass the noise to load instead: {cls.__name__}.load(path, action_noise=...) (None for none)."
            ) from err

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        # The episodes running at the newest stored step end with the env they ran in, from the observations after
        # it, which set_env lets go (the new env's first reset would find none and make that step terminal).
        last = self._observations_after_the_buffer()
        super().set_env(env, force_reset)
        buffer = getattr(self, "replay_buffer", None)
        if force_reset:
            self._last_original_obs = None  # the old env's, as _last_obs
            if buffer is not None:
                buffer.end_episodes(last)
                self._buffer_from_file = False
        if isinstance(self.replay_buffer, HerReplayBuffer):
            self.replay_buffer.env = self.env  # relabeled rewards come from the env trained on

    # ------------------------------------------------------------------ replay buffer files
    def save_replay_buffer(self, path) -> None:
        """Write the replay buffer to ``path`` atomically, as an ``.npz`` archive of plain arrays (no pickle); a
        path without a suffix gets ``.pkl``, as SB3 names the file (:meth:`covey.buffers.replay.ReplayBuffer.save`)."""
        self.replay_buffer.save(path)

    def load_replay_buffer(self, path, truncate_last_traj: bool = True) -> None:
        """Fill the replay buffer from :meth:`save_replay_buffer`'s file (``path`` as given there, or the file).
        A file of another ``buffer_size``, ``optimize_memory_usage``, ``n_steps`` or ``handle_timeout_termination``
        gives the model a buffer of the file's, as SB3's load replaces the buffer with the file's (the model's
        settings follow it). With hindsight replay, ``truncate_last_traj`` ends the episodes the file left
        running, as SB3 does (and warns where there are some)."""
        path, data = read_buffer_file(path)
        capacity, n_envs, optimize = file_layout(path, data)
        buffer = self.replay_buffer
        returns = file_returns(path, data) or (buffer.n_steps, buffer.handle_timeout_termination)  # older files
        wanted = (capacity, optimize, *returns)
        if n_envs == buffer.n_envs and wanted != (
            buffer.capacity,
            buffer.optimize_memory_usage,
            buffer.n_steps,
            buffer.handle_timeout_termination,
        ):
            cfg = self.config
            kept = (cfg.buffer_size, cfg.optimize_memory_usage, cfg.n_steps, self._handle_timeouts)
            # the file's rows of n_envs, and its returns
            cfg.buffer_size, cfg.optimize_memory_usage, cfg.n_steps, self._handle_timeouts = (
                capacity * n_envs,
                *wanted[1:],
            )
            try:
                self._setup_replay_buffer()
                self.replay_buffer.fill(path, data)
            except BaseException:  # a file of other spaces: the model keeps its buffer
                self.replay_buffer = buffer
                cfg.buffer_size, cfg.optimize_memory_usage, cfg.n_steps, self._handle_timeouts = kept
                raise
            self._list_settings()
        else:
            buffer.fill(path, data)
        self._buffer_from_file = True  # its newest step is not followed by this model's last observations
        if "her/ep_length" in data and not isinstance(self.replay_buffer, HerReplayBuffer):
            warn_user(
                "The replay buffer file was saved by a hindsight replay buffer (HerReplayBuffer), and this model's "
                "buffer is a plain one: its transitions are loaded, and no goal is relabelled. Load the file into a "
                "model built with replay_buffer_class=HerReplayBuffer to go on with hindsight replay."
            )
        if truncate_last_traj and isinstance(self.replay_buffer, HerReplayBuffer):
            if self.replay_buffer.truncate_last_trajectory():
                warn_user(
                    "The replay buffer file ends in running episodes, which loading ends (truncate_last_traj=True). "
                    "If training goes on in those same episodes (the env was not reset since the save), load with "
                    "truncate_last_traj=False."
                )

    def _warn_slow_bfloat16(self) -> None:
        """Warn where bf16_matmuls=True slows this CPU's gradient steps down: PyTorch has no oneDNN bfloat16
        products here, or has them without a kernel faster than float32's (measured once per process)."""
        if not linear.fast_bfloat16_products():
            warn_user(
                "SAC(bf16_matmuls=True): this CPU has no fast bfloat16 matrix products (PyTorch multiplies "
                "bfloat16 in oneDNN only with AVX-512 or Arm's bfloat16 instructions; its CPU capability here is "
                f"{torch.backends.cpu.get_cpu_capability()}), so each gradient step's bfloat16 products run in a "
                "fallback loop, tens of times slower than in float32. Use bf16_matmuls=False on this machine."
            )
            return
        speedup = linear.bfloat16_product_speedup()
        if speedup < 1.0:
            warn_user(
                f"SAC(bf16_matmuls=True): on this CPU a 256x256x256 bfloat16 matrix product takes {1 / speedup:.1f}x "
                "the time of a float32 one (its oneDNN has no fast bfloat16 kernel here: on x86, AMX or AMD's "
                "AVX-512 BF16 units make one), so the gradient steps run slower, not faster. Use "
                "bf16_matmuls=False on this machine."
            )

    # ------------------------------------------------------------------ training loop
    @outside_inference_mode
    def learn(
        self,
        total_timesteps: int,
        callback: Any = None,
        log_interval: int = 4,
        tb_log_name: str = "SAC",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SAC:
        """Collect and train until ``total_timesteps`` env steps (over all envs); returns self."""
        if self.config.bf16_matmuls and self.device.type == "cpu":
            self._warn_slow_bfloat16()
        if self.replay_buffer is not None and not isinstance(self.replay_buffer, ReplayBuffer):
            kind = type(self.replay_buffer)
            raise TypeError(
                f"model.replay_buffer is a {kind.__module__}.{kind.__qualname__}: covey's SAC stores and samples "
                "with its own buffer, which another buffer cannot stand for. Fill the model's buffer instead: "
                "model.replay_buffer.add(obs, next_obs, action, reward, done, infos) takes SB3's arguments, and "
                "model.load_replay_buffer(path) reads a file that covey's save_replay_buffer wrote."
            )
        noise = self.action_noise
        if noise is not None:  # as SB3: one noise process per env, each started afresh
            n_envs = 1 if self.env is None else self.env.num_envs
            if isinstance(noise, VectorizedActionNoise) and noise.n_envs != n_envs:  # a loaded model's, say
                noise = noise.base_noise
            if n_envs > 1 and not isinstance(noise, VectorizedActionNoise):
                noise = VectorizedActionNoise(noise, n_envs)
            self.action_noise = noise
            noise.reset()
        self._check_log_interval(log_interval)
        # SB3's call, which a subclass's override of _setup_learn takes
        total_timesteps, callback = self._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        callback.on_training_start(locals(), globals())
        cfg = self.config
        while self.num_timesteps < total_timesteps:
            rollout = self.collect_rollouts(
                self.env,
                callback,
                cfg.train_freq,
                self.replay_buffer,
                self.action_noise,
                cfg.learning_starts,
                log_interval,
            )
            if not rollout.continue_training:
                break
            # Training waits for a buffer it can sample: after load (the buffer starts empty, the step count
            # does not), or with learning_starts=0 and optimize_memory_usage, which needs two stored steps.
            if self.num_timesteps > cfg.learning_starts and self.replay_buffer.can_sample():
                gradient_steps = cfg.gradient_steps if cfg.gradient_steps >= 0 else rollout.episode_timesteps
                if gradient_steps > 0:
                    with torch.enable_grad():  # as in on-policy learning (covey.agents.base)
                        self.train(gradient_steps, cfg.batch_size)
                    self._check_weights_finite(after_update=True)
        callback.on_training_end()
        return self

    def collect_rollouts(
        self,
        env: VecEnv,
        callback: BaseCallback,
        train_freq: TrainFreq,
        replay_buffer: Any,
        action_noise: ActionNoise | None = None,
        learning_starts: int = 0,
        log_interval: int | None = None,
    ) -> RolloutReturn:
        """SB3's: step the envs until ``train_freq`` is met, acting at random before ``learning_starts`` steps,
        with ``action_noise`` (the model's env and replay buffer, which a subclass's override passes on). Returns
        SB3's ``RolloutReturn``: env steps of all envs, episodes ended, whether to continue."""
        self._check_collection(env, replay_buffer, "replay_buffer")
        train_freq = _train_freq(train_freq)
        cfg, actor = self.config, self.actor
        # Callbacks read these locals by SB3's names: actions (as the env takes them), buffer_actions,
        # replay_buffer, train_freq, learning_starts, num_collected_steps, num_collected_episodes.
        set_train_mode(actor, False)
        use_sde, sde_sample_freq = cfg.use_sde, cfg.sde_sample_freq
        if use_sde:  # as SB3: exploration matrices for this collection (one per env)
            actor.reset_noise(env.num_envs)
        callback.on_rollout_start()
        num_collected_steps = num_collected_episodes = 0
        continue_training = True  # SB3's local, which callbacks may read
        while (
            num_collected_steps if train_freq.unit == TrainFrequencyUnit.STEP else num_collected_episodes
        ) < train_freq.frequency:
            if use_sde and sde_sample_freq > 0 and num_collected_steps % sde_sample_freq == 0:
                actor.reset_noise(env.num_envs)
            actions, buffer_actions = self._sample_action(learning_starts, action_noise, env.num_envs)
            new_obs, rewards, dones, infos = env.step(actions)
            self.num_timesteps += env.num_envs
            num_collected_steps += 1
            callback.update_locals(locals())
            if not callback.on_step():
                continue_training = False
                return RolloutReturn(num_collected_steps * env.num_envs, num_collected_episodes, continue_training)
            self._update_info_buffer(infos, dones)
            self._store_transition(replay_buffer, buffer_actions, new_obs, rewards, dones, infos)
            if self._normalizes_observations():  # once they passed the store's finiteness check
                self._update_finite_statistics(batch_to_tensor(new_obs, self.observation_space, self.device))
            # as SB3: schedules' progress moves with every step, and the model's own _on_step hook runs
            self._update_current_progress_remaining(self.num_timesteps, self._total_timesteps)
            self._on_step()
            for idx in np.flatnonzero(dones):
                num_collected_episodes += 1
                self._episode_num += 1
                if action_noise is not None:  # a fresh noise process for the env's next episode
                    action_noise.reset(**({"indices": [int(idx)]} if env.num_envs > 1 else {}))
                if log_interval is not None and self._episode_num % log_interval == 0:
                    self.dump_logs()  # SB3's call, which a subclass's override takes
        callback.on_rollout_end()
        return RolloutReturn(num_collected_steps * env.num_envs, num_collected_episodes, True)

    def _sample_action(
        self, learning_starts: int, action_noise: ActionNoise | None = None, n_envs: int = 1
    ) -> tuple[np.ndarray, np.ndarray]:
        """SB3's: ``(actions for the env, actions for the buffer)`` of one step of ``n_envs`` envs, at random before
        ``learning_starts`` steps (but with gSDE at warm-up), then the policy's; ``action_noise`` is added to the
        buffer's actions in [-1, 1], also while acting at random."""
        cfg, actor = self.config, self.actor
        if self.num_timesteps < learning_starts and not (cfg.use_sde and cfg.use_sde_at_warmup):
            actions = np.array([self.action_space.sample() for _ in range(n_envs)])
            buffer_actions = self._to_buffer_actions(actions)
            if not self.discrete:  # as SB3 steps the env: the sample scaled into [-1, 1] and back (bits may differ)
                actions = self._to_env_actions(buffer_actions)
        elif self._sb3_policy_class is not None:
            # as SB3's SAC: the policy's actions for the env, scaled to [-1, 1]
            buffer_actions = self.policy.scale_action(self.policy.predict(self._last_obs)[0])
            actions = self.policy.unscale_action(buffer_actions)
        else:
            obs = batch_to_tensor(self._last_obs, self.observation_space, self.device)
            with acting_mode(actor):  # through the actor's call, SB3's, which a forward hook on it sees
                buffer_actions = actor(obs).cpu().numpy()
            actions = actor.to_env_actions(buffer_actions)
        if action_noise is not None:
            noise = np.asarray(action_noise())
            if noise.size == buffer_actions.size:  # a noise shaped as the action space (SB3 takes that too)
                noise = noise.reshape(buffer_actions.shape)
            buffer_actions = np.clip(buffer_actions + noise, -1.0, 1.0).astype(buffer_actions.dtype)
            actions = self._to_env_actions(buffer_actions)
        return actions, buffer_actions

    def _to_env_actions(self, buffer_actions: np.ndarray) -> np.ndarray:
        """Box actions in [-1, 1] rescaled to the env's bounds, by the policy that acts."""
        if self._sb3_policy_class is not None:
            return self.policy.unscale_action(buffer_actions)
        return self.actor.to_env_actions(buffer_actions)

    def _on_step(self) -> None:
        """SB3's hook after each collected step (a no-op in SB3's SAC, whose target critics move in ``train``)."""

    def _to_buffer_actions(self, env_actions: np.ndarray) -> np.ndarray:
        """Env actions to what the buffer stores: Box actions rescaled into [-1, 1]."""
        if self.discrete:
            return env_actions
        low, high = self.action_space.low, self.action_space.high
        return (2.0 * (env_actions - low) / (high - low) - 1.0).reshape(env_actions.shape[0], -1)

    def _update_finite_statistics(self, obs: Any) -> None:
        """The statistics take a step's observations where all are finite; an env's reset observation is checked
        only as the next step's, which then raises: until then the statistics wait."""
        values = obs.values() if isinstance(obs, dict) else (obs,)
        if all(bool(torch.isfinite(v).all()) for v in values if v.is_floating_point()):
            self._update_observation_statistics(obs)

    def _observations_after_the_buffer(self) -> Any:
        """The observations after the replay buffer's newest stored step (the original ones behind a
        VecNormalize), for :meth:`ReplayBuffer.end_episodes`; None where the model holds none, or where its buffer
        came from a file since (its newest step is another run's)."""
        if getattr(self, "_buffer_from_file", False):
            return None
        original = self.get_vec_normalize_env() is not None
        return getattr(self, "_last_original_obs" if original else "_last_obs", None)

    def _reset_env(self) -> None:
        buffer = getattr(self, "replay_buffer", None)
        if buffer is not None:  # the reset cuts the episodes of the newest stored steps: they end there
            buffer.end_episodes(self._observations_after_the_buffer())
            self._buffer_from_file = False
        super()._reset_env()
        vec_normalize = self.get_vec_normalize_env()
        self._last_original_obs = self._original_obs(vec_normalize) if vec_normalize is not None else None

    def _original_obs(self, vec_normalize: Any) -> Any:
        """The VecNormalize's original observations in the model's layout: a VecImageLayout above it (an env
        of the other image layout than the model's) moves the channel axis of what it steps, not of these."""
        obs = vec_normalize.get_original_obs()
        return self.env._fit(obs) if isinstance(self.env, VecImageLayout) else obs

    def _store_transition(self, replay_buffer, actions, new_obs, rewards, dones, infos) -> None:
        """SB3's: store one step of every env in ``replay_buffer`` (the model's), and move on to ``new_obs``."""
        self._check_collection(self.env, replay_buffer, "replay_buffer")
        self._buffer_from_file = False  # the newest step is this model's own from here
        # Behind a VecNormalize the buffer keeps the original observations and rewards, normalized when sampled
        # with the statistics of that time (as SB3 does): stored normalized ones would go stale as they move.
        vec_normalize = self.get_vec_normalize_env()
        obs, stored_new_obs = self._last_obs, new_obs
        if vec_normalize is not None:
            obs = self._last_original_obs
            if obs is None:  # an env attached without a reset: the best original there is
                obs = vec_normalize.unnormalize_obs(self._last_obs)
            stored_new_obs, rewards = self._original_obs(vec_normalize), vec_normalize.get_original_reward()
        next_obs = stored_new_obs
        terminated = dones.copy()
        for i in np.flatnonzero(dones):
            final = infos[i].get("terminal_observation")
            if final is not None:
                check_terminal_observation(final, stored_new_obs, i)
                # The true final observation, not the reset one, is the next state of this transition.
                if next_obs is stored_new_obs:
                    next_obs = _copy_obs(stored_new_obs)
                if vec_normalize is not None:  # VecNormalize normalized it in the info
                    final = vec_normalize.unnormalize_obs(final)
                _set_env_obs(next_obs, i, final)
            if self._handle_timeouts and infos[i].get("TimeLimit.truncated", False):
                terminated[i] = False  # a time limit keeps the bootstrap
        check_finite("in this step", observations=(obs, next_obs), rewards=rewards)
        check_discrete_observations("in this step", (obs, next_obs), self.observation_space)
        self.replay_buffer.store(obs, next_obs, actions, rewards, terminated, dones, infos)
        self._last_obs = new_obs
        if vec_normalize is not None:
            self._last_original_obs = stored_new_obs

    def _ent_coef(self) -> torch.Tensor:
        if self.log_ent_coef is not None:
            return self.log_ent_coef.detach().exp()
        return torch.as_tensor(self.ent_coef_tensor, dtype=torch.float32, device=self.device)

    def train(self, gradient_steps: int, batch_size: int = 64) -> None:
        """``gradient_steps`` SAC updates on minibatches of ``batch_size``: temperature, critics, actor, then the
        target critics. ``learn`` passes the model's ``batch_size``; a call without one takes 64, as SB3's does."""
        # SB3's calls (the optimizers as SB3's SAC passes them), which a subclass's overrides take
        self._update_current_progress_remaining(self.num_timesteps, self._total_timesteps)
        self._relink_parameters()
        self._update_learning_rate(list(self._optimizers().values()))
        set_train_mode(self.actor, True)
        set_train_mode(self.critic, True)
        set_train_mode(self.critic_target, False)
        history: dict[str, list[torch.Tensor]] = {}
        self._q_and_targets = []
        manual = None if has_hooks(self.actor, self.critic, self.critic_target) else self._manual
        if manual is not None:
            manual.bind()
        vec_normalize = self.get_vec_normalize_env()
        for _ in range(gradient_steps):
            batch = self.replay_buffer.sample_batch(batch_size, env=vec_normalize)
            if self._sb3_policy_class is not None:
                stats, q_and_target = self._sb3_gradient_step(batch)
            elif manual is None:
                stats, q_and_target = self._gradient_step(batch)
            else:
                stats, q_and_target = manual.step(self, batch)
            for key, value in stats.items():
                history.setdefault(key, []).append(value)
            self._q_and_targets.append(q_and_target)
            self._n_updates += 1
            # The interval counts gradient steps over the whole run, not within one train() call.
            if self._n_updates % self.config.target_update_interval == 0:
                if self._sb3_policy_class is not None:
                    # every critic parameter, as SB3's SAC (a shared extractor's too)
                    polyak_update(
                        list(self.critic_target.parameters()), list(self.critic.parameters()), self.config.tau
                    )
                else:
                    polyak_update(
                        [self._target_flat.data], [self.critic_optimizer.flat_parameters.data], self.config.tau
                    )
                    if self._shared_polyak[0]:
                        polyak_update(*self._shared_polyak, self.config.tau)
                for target, stat in self._running_stats:
                    target.copy_(stat)
        for key, values in history.items():
            self.logger.record(f"train/{key}", (values[0] if len(values) == 1 else torch.stack(values).mean()).item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")

    def dump_logs(self) -> None:
        """Write one row of logs now, as training does every ``log_interval`` episodes (SB3's public method)."""
        self._dump_logs()

    def _dump_logs(self, iteration: int | None = None, counter: str | None = "time/episodes") -> None:
        """SB3's: one row of logs, counted in episodes (``iteration``: the model's episodes, by default)."""
        if iteration is None:
            iteration = self._episode_num
        # The critics' diagnostics of the last train() call, like its losses; reduced only when a row of logs
        # is written, not at every gradient step.
        pairs = getattr(self, "_q_and_targets", None)
        if pairs:
            current_q, target = (torch.stack(x) for x in zip(*pairs))
            for key, value in q_diagnostics(current_q, target).items():
                self.logger.record(f"train/{key}", value.item())
            self._q_and_targets = []
        if self.config.use_sde:  # as SB3: the exploration's standard deviation, averaged
            with torch.no_grad():
                std = self.actor.get_std() if self._sb3_policy_class is not None else self.actor.head.std()
                self.logger.record("train/std", std.mean().item())
        super()._dump_logs(iteration, counter)

    def _gradient_step(self, batch: ReplayBatch) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """One SAC update: temperature, critics, actor (in SB3's order). Returns the losses and other detached
        statistics, and the critics' values with their targets (for :func:`q_diagnostics`)."""
        stats: dict[str, torch.Tensor] = {}
        if self.config.use_sde:  # as SB3: a new exploration matrix, through which the actor's loss reaches log_std
            self.actor.head.reset_noise(differentiable=True)
        sample = self._policy_sample(batch.observations)
        # This step's losses use the temperature from before its update (SB3's order).
        ent_coef = self._ent_coef()
        stats["ent_coef"] = ent_coef.reshape(())
        if self.log_ent_coef is not None:
            loss = self._temperature_objective(sample)
            self._step(self.ent_coef_optimizer, loss)
            stats["ent_coef_loss"] = loss.detach()
        loss, critic_stats, q_and_target = self._critic_objective(batch, ent_coef)
        self._step(self.critic_optimizer, loss)
        if self.critic_ema is not None:
            self.critic_ema.update()
        stats["critic_loss"] = loss.detach()
        stats.update(critic_stats)
        loss = self._actor_objective(batch, sample, ent_coef)
        self._step(self.actor_optimizer, loss)
        stats["actor_loss"] = loss.detach()
        if self.config.use_sde:  # the exploration matrix stays for acting, without the step's graph
            self.actor.head.exploration = self.actor.head.exploration.detach()
        return stats, q_and_target

    def _sb3_gradient_step(
        self, batch: ReplayBatch
    ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`_gradient_step` for a user's SB3 policy class, through SB3's calls (``actor.action_log_prob``,
        the critics' tuples of Q-values) and the policy's own optimizers, in SB3's order."""
        stats: dict[str, torch.Tensor] = {}
        if self.config.use_sde:
            self.actor.reset_noise()
        actions_pi, log_prob = self.actor.action_log_prob(batch.observations)
        ent_coef = self._ent_coef()
        stats["ent_coef"] = ent_coef.reshape(())
        if self.log_ent_coef is not None:
            loss = temperature_loss(self.log_ent_coef, log_prob, self.target_entropy)
            self._step(self.ent_coef_optimizer, loss)
            stats["ent_coef_loss"] = loss.detach()
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.action_log_prob(batch.next_observations)
            next_q = _stacked(self.critic_target(batch.next_observations, next_actions))
            target = soft_q_target(
                batch.rewards, batch.terminated, next_q, next_log_prob, ent_coef, discount(batch, self.config.gamma)
            )
        current_q = _stacked(self.critic(batch.observations, batch.actions))
        loss = critic_loss(current_q, target)
        _sb3_step(self.critic.optimizer, loss)
        stats["critic_loss"] = loss.detach()
        with outside_the_graph(self.critic):  # the actor's loss reaches the action only (SB3 zeroes the rest)
            q_pi = _stacked(self.critic(batch.observations, actions_pi))
        loss = actor_loss(q_pi, log_prob, ent_coef)
        _sb3_step(self.actor.optimizer, loss)
        stats["actor_loss"] = loss.detach()
        return stats, (current_q.detach(), target)

    def _run(self, network: Any, *inputs: Any) -> torch.Tensor:
        """``network(*inputs)`` for a gradient step: as it is, or under bfloat16 autocast with a float32
        result (``bf16_matmuls``). Each call is its own autocast region, so no bfloat16 copy of a weight
        outlives the optimizer step that changes it."""
        if not self.config.bf16_matmuls:
            return network(*inputs)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            out = network(*inputs)
        return out.float()

    @staticmethod
    def _step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        flat = optimizer.flat_parameters
        flat.zero_grad()
        loss.backward()
        flat.step(optimizer)

    def _policy_sample(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy at ``obs``: ``(actions, log_prob)`` for Box (a reparameterized sample), and
        ``(log_probs over all actions, E[log pi])`` for Discrete."""
        params = self._run(self.actor.distribution_params, obs)
        if self.discrete:
            log_probs = params.log_softmax(-1)  # (B, n_actions)
            return log_probs, (log_probs.exp() * log_probs).sum(-1)  # E[log pi] = -entropy, (B,)
        return self.actor.head.rsample(params)

    def _temperature_objective(self, sample: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Reaches only log(alpha): the policy's log-probability enters detached."""
        return temperature_loss(self.log_ent_coef, sample[1], self.target_entropy)

    def _critic_objective(
        self, batch: ReplayBatch, ent_coef: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """Critic loss against the target critics at the policy's next action; reaches only the critics.

        Returns the loss, detached statistics (the EMA regularizer, two-hot entropy) and the detached values
        ``(n_critics, B)`` with their targets ``(B,)``, from which :func:`q_diagnostics` computes the rest.
        """
        cfg = self.config
        with torch.no_grad():
            next_params = self._run(self.actor.distribution_params, batch.next_observations)
            if self.discrete:
                next_q = self._run(self.critic_target.values, batch.next_observations)
                target = discrete_soft_q_target(
                    batch.rewards,
                    batch.terminated,
                    next_q,
                    next_params.log_softmax(-1),
                    ent_coef,
                    discount(batch, cfg.gamma),
                )
            else:
                next_actions, next_log_prob = self.actor.head.rsample(next_params)
                next_q = self._run(self.critic_target.values, batch.next_observations, next_actions)
                target = soft_q_target(
                    batch.rewards, batch.terminated, next_q, next_log_prob, ent_coef, discount(batch, cfg.gamma)
                )
        head = self.critic.value_head
        raw = self._raw_q_taken(self.critic, batch)  # (n_critics, B) or (n_critics, B, K)
        current_q = head.value(raw)  # (n_critics, B)
        if head.distributional:
            loss = head.loss(raw, target.expand_as(current_q)).mean(dim=1).sum()
        else:
            loss = critic_loss(current_q, target)
        stats = {}
        if self.critic_ema is not None:
            with torch.no_grad():
                ema_raw = self._raw_q_taken(self.critic_ema.model, batch)
            ema_loss = ema_regularizer(raw, ema_raw, head)
            loss = loss + self.policy_config.critic_ema_coef * ema_loss
            stats["critic_ema_loss"] = ema_loss.detach()
        if head.distributional:
            with torch.no_grad():
                stats["q_entropy"] = head.entropy(raw).mean()
        return loss, stats, (current_q.detach(), target)

    def _raw_q_taken(self, critic: torch.nn.Module, batch: ReplayBatch) -> torch.Tensor:
        """The critics' raw outputs at the stored actions: ``(n_critics, B[, K])``."""
        if not self.discrete:
            return self._run(critic.raw, batch.observations, batch.actions)
        raw = self._run(critic.raw, batch.observations)  # (n_critics, B, n_actions[, K])
        taken = batch.actions.long() - int(self.action_space.start)  # the buffer keeps Discrete(n, start)'s actions
        index = taken.view(1, -1, 1, *([1] * (raw.dim() - 3)))
        index = index.expand(raw.shape[0], -1, 1, *raw.shape[3:])
        return raw.gather(2, index).squeeze(2)

    def _actor_objective(
        self, batch: ReplayBatch, sample: tuple[torch.Tensor, torch.Tensor], ent_coef: torch.Tensor
    ) -> torch.Tensor:
        """Actor loss against the critics; the critics' parameters are left out of its graph."""
        with outside_the_graph(self.critic):
            if self.discrete:
                return discrete_actor_loss(self._run(self.critic.values, batch.observations), sample[0], ent_coef)
            return actor_loss(self._run(self.critic.values, batch.observations, sample[0]), sample[1], ent_coef)


@contextlib.contextmanager
def outside_the_graph(module: torch.nn.Module):
    """``module``'s parameters with ``requires_grad=False`` inside the block, each set back to its own flag after
    it (a parameter the user froze stays frozen)."""
    flags = [(p, p.requires_grad) for p in module.parameters()]
    module.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


class _Temperature:
    """The learned log-temperature as a parameter group: ``{"log_ent_coef": tensor}``."""

    def __init__(self, log_ent_coef: torch.Tensor) -> None:
        self.log_ent_coef = log_ent_coef

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"log_ent_coef": self.log_ent_coef.detach().clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            self.log_ent_coef.copy_(state["log_ent_coef"])


def _stacked(q_values: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """An SB3 critic's tuple of ``(B, 1)`` Q-values as ``(n_critics, B)``."""
    return torch.stack([q.reshape(-1) for q in q_values])


def _sb3_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _copy_obs(obs):
    return {k: v.copy() for k, v in obs.items()} if isinstance(obs, dict) else obs.copy()


def _set_env_obs(obs, i: int, value) -> None:
    if isinstance(obs, dict):
        for k in obs:
            obs[k][i] = value[k]
    else:
        obs[i] = value


# As covey's PPO for OnPolicyAlgorithm (see there): isinstance(model, OffPolicyAlgorithm) holds for covey's SAC.
OffPolicyAlgorithm.register(SAC)

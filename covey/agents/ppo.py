"""Proximal Policy Optimization (Schulman et al. 2017, https://arxiv.org/abs/1707.06347) with SB3's API."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.utils import explained_variance
from stable_baselines3.common.vec_env import VecEnv

from covey.agents.base import (
    BaseAgent,
    PolicyAliases,
    Schedule,
    has_hooks,
    merge_parameter_groups,
    require,
    require_numbers,
    scheduled,
    set_train_mode,
    warn_batch_size,
)
from covey.agents.recurrent import RecurrentRollout, RNNStates
from covey.agents.sb3_policy import SB3PolicyTrainer, sb3_policy_class
from covey.buffers.finite import check_discrete_observations, check_finite, check_terminal_observation
from covey.buffers.rollout import RolloutBatch, RolloutBuffer
from covey.networks.actor_critic import (
    PPO_ADAM_EPS,
    SAC_ONLY_KWARGS,
    Actor,
    Critic,
    PolicyConfig,
    actor_critic_forward,
    build_actor_critic,
    memory_settings,
)
from covey.networks.distributions import CategoricalHead, DiagGaussianHead, StateDependentGaussianHead
from covey.networks.ema import CriticEMA, ema_regularizer
from covey.networks.encoders import FlattenEncoder, NormalizedEncoder, RunningNormalizer
from covey.networks.mlp import ManualMLP, PairedMLP
from covey.networks.obs import ObsTensor, batch_to_tensor
from covey.networks.policies import ActorCriticPolicy
from covey.networks.sb3_names import translate_groups
from covey.networks.twohot import ScalarHead
from covey.spaces import check_finite_bounds
from covey.warning import warn_user

# Observations per forward pass when values and log-probs are computed for a whole rollout.
_EVAL_CHUNK = 4096


@dataclass
class OnPolicyConfig:
    """Hyperparameters shared by the on-policy agents (PPO, POCA), named and defaulted as in SB3's PPO."""

    agent: ClassVar[str] = "PPO"
    minibatch_advantages: ClassVar[bool] = True
    """Whether ``normalize_advantage`` normalizes within each minibatch (PPO's, as SB3's) or over the update."""

    learning_rate: Schedule = 3e-4
    """Adam step size, or a function of the remaining progress (1 -> 0)."""
    n_steps: int = 2048
    """Steps collected per env (copy) per rollout; the rollout holds n_steps * n_envs steps."""
    batch_size: int = 64
    """Minibatch size."""
    n_epochs: int = 10
    """Passes over the rollout per update."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda (the lambda of the lambda-returns): bias/variance trade-off of the advantage."""
    clip_range: Schedule = 0.2
    """Clipping of the probability ratio (or a schedule)."""
    normalize_advantage: bool = True
    """Normalize advantages per minibatch."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient norm clip."""
    target_kl: float | None = None
    """Stop the epochs early when the approximate KL of a minibatch exceeds 1.5 * target_kl."""
    stats_window_size: int = 100
    """Episodes averaged for rollout/ep_rew_mean and rollout/ep_len_mean."""

    def need(self, ok: bool, name: str, rule: str) -> None:
        require(ok, self.agent, name, getattr(self, name), rule)

    def __post_init__(self) -> None:
        require_numbers(self, self.agent)
        need = self.need
        need(isinstance(self.n_steps, (int, np.integer)) and self.n_steps >= 1, "n_steps", "it must be an int >= 1")
        need(isinstance(self.batch_size, (int, np.integer)) and self.batch_size >= 1, "batch_size", "it must be >= 1")
        need(
            not (self.normalize_advantage and self.batch_size == 1 and self.minibatch_advantages),
            "batch_size",
            "it must be > 1 when normalize_advantage=True (a single advantage cannot be normalized)",
        )
        need(isinstance(self.n_epochs, (int, np.integer)) and self.n_epochs >= 1, "n_epochs", "it must be >= 1")
        need(0.0 <= self.gamma <= 1.0, "gamma", "it must lie in [0, 1]")
        need(0.0 <= self.gae_lambda <= 1.0, "gae_lambda", "it must lie in [0, 1]")
        need(callable(self.clip_range) or self.clip_range > 0, "clip_range", "it must be > 0 or a schedule")
        need(callable(self.learning_rate) or self.learning_rate >= 0, "learning_rate", "it must be >= 0 or a schedule")
        need(self.max_grad_norm > 0, "max_grad_norm", "it must be > 0")
        need(self.target_kl is None or self.target_kl > 0, "target_kl", "it must be None or > 0")
        need(self.stats_window_size >= 1, "stats_window_size", "it must be >= 1")


@dataclass
class PPOConfig(OnPolicyConfig):
    """PPO's hyperparameters, named and defaulted as in Stable-Baselines3."""

    clip_range_vf: Schedule | None = None
    """Clipping of the value change around the old value (None: no value clipping)."""
    use_sde: bool = False
    """Generalized state-dependent exploration for Box actions (the noise a linear function of the state)."""
    sde_sample_freq: int = -1
    """With use_sde: draw new exploration matrices every this many steps (-1, or any value < 1: once per
    rollout)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.need(isinstance(self.sde_sample_freq, (int, np.integer)), "sde_sample_freq", "it must be an int")
        self.need(
            self.clip_range_vf is None or callable(self.clip_range_vf) or self.clip_range_vf > 0,
            "clip_range_vf",
            "it must be None, > 0 or a schedule",
        )


def clipped_surrogate_loss(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped policy objective: ``(loss, approx_kl, clip_fraction)``, the last two detached."""
    # The advantage weights the log-prob; it must carry no gradient (into the critic or anywhere).
    advantages = advantages.detach()
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip_range, 1 + clip_range) * advantages)
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_fraction = ((ratio - 1).abs() > clip_range).float().mean()
    return -surrogate.mean(), approx_kl, clip_fraction


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_range_vf: float | None
) -> torch.Tensor:
    """Squared error of the value against the return, optionally clipped around the old value."""
    error = (returns - values).pow(2)
    if clip_range_vf is not None:
        # Pessimistic value clipping: the larger of the clipped and unclipped errors.
        clipped = old_values + (values - old_values).clamp(-clip_range_vf, clip_range_vf)
        error = torch.max(error, (returns - clipped).pow(2))
    return error.mean()


def ppo_loss(
    batch: RolloutBatch,
    actor: Actor,
    critic: Critic,
    clip_range: float,
    clip_range_vf: float | None,
    ent_coef: float,
    vf_coef: float,
    normalize_advantage: bool,
    critic_ema: Critic | None = None,
    ema_coef: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO objective on one minibatch: ``(loss, detached stats)``.

    With a two-hot value head the value loss is the cross-entropy against two-hot(symlog(return)); its
    scale does not depend on the reward scale, and value clipping does not apply. ``critic_ema`` adds the
    EMA regularizer to the value loss.
    """
    params, raw = actor_critic_forward(actor, critic, batch.observations)
    log_prob, entropy = actor.evaluate_params(params, batch.actions)
    ema_raw = None
    if critic_ema is not None:
        with torch.no_grad():
            ema_raw = critic_ema.raw(batch.observations)
    return ppo_objective(
        log_prob,
        entropy,
        raw,
        critic.value_head,
        batch,
        clip_range,
        clip_range_vf,
        ent_coef,
        vf_coef,
        normalize_advantage,
        ema_raw,
        ema_coef,
    )


def ppo_objective(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    raw: torch.Tensor,
    head: torch.nn.Module | None,
    batch: RolloutBatch,
    clip_range: float,
    clip_range_vf: float | None,
    ent_coef: float,
    vf_coef: float,
    normalize_advantage: bool,
    ema_raw: torch.Tensor | None = None,
    ema_coef: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO loss from the networks' outputs on a batch of samples (shared by feed-forward and
    recurrent training, and an SB3 policy's values with ``head=None``): ``(loss, detached stats)``."""
    advantages = batch.advantages
    if normalize_advantage and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss, approx_kl, clip_fraction = clipped_surrogate_loss(log_prob, batch.old_log_prob, advantages, clip_range)
    if head is not None and head.distributional:
        v_loss = head.loss(raw, batch.returns).mean()
    else:
        v_loss = value_loss(raw, batch.old_values, batch.returns, clip_range_vf)
    stats = {}
    if ema_raw is not None:
        ema_loss = ema_regularizer(raw, ema_raw, head)
        stats["critic_ema_loss"] = ema_loss.detach()
        v_loss = v_loss + ema_coef * ema_loss
    entropy_loss = -entropy.mean()
    loss = policy_loss + ent_coef * entropy_loss + vf_coef * v_loss
    stats.update(
        {
            "policy_gradient_loss": policy_loss.detach(),
            "value_loss": v_loss.detach(),
            "entropy_loss": entropy_loss.detach(),
            "approx_kl": approx_kl,
            "clip_fraction": clip_fraction,
            "loss": loss.detach(),
        }
    )
    return loss, stats


class ManualPPOUpdate:
    """PPO's epochs of minibatch updates for feed-forward MLP networks, with hand-written gradients.

    The same losses (:func:`ppo_loss`), minibatches, update order and optimizer steps as the autograd
    path, in far fewer operations, which is what a minibatch of a small MLP costs on a CPU: the weight-free
    encoders run once per rollout, each epoch permutes the rollout once and normalizes each minibatch's
    advantages on its own (as SB3 does) in one batched operation, :class:`~covey.networks.mlp.ManualMLP` writes
    the gradients straight into the optimizer's flat gradient buffer (both trunks at once where
    :class:`~covey.networks.mlp.PairedMLP` pairs them), and the logged statistics are reduced once per update.

    It applies (:meth:`applies`) to weight-free encoders (``MlpPolicy`` on vector, Discrete or
    MultiBinary observations), ``Linear`` + Tanh/ReLU trunks, a Discrete or Box action head (with or without
    ``use_sde``), the scalar value head, no value clipping, no critic EMA and no recurrent memory; PPO uses
    autograd otherwise.
    """

    HEADS = (CategoricalHead, DiagGaussianHead, StateDependentGaussianHead)

    def __init__(self, actor: Actor, critic: Critic) -> None:
        self.actor, self.critic = actor, critic
        self.policy_net = ManualMLP(actor.trunk, actor.head.proj)
        self.value_net = ManualMLP(critic.trunk, critic.value_head.proj)
        self.sde = type(actor.head) is StateDependentGaussianHead  # its terms read the latent too
        self.pair: PairedMLP | None = None  # both trunks run as one, where bind() pairs them
        self.bind()

    def bind(self) -> None:
        """Read the networks' gradient tensors and the CPU's kernel choices (:meth:`ManualMLP.bind`), and pair the
        trunks (:class:`~covey.networks.mlp.PairedMLP`) where they read one encoder's output and have the same
        hidden layers (not with gSDE, whose terms read the policy's latent)."""
        self.policy_net.bind()
        self.value_net.bind()
        shared = self.critic.encoder is self.actor.encoder
        self.pair = PairedMLP.of(self.policy_net, self.value_net) if shared and not self.sde else None

    def act(self, obs: ObsTensor) -> torch.Tensor:
        """Sampled actions for a batch of observations: :meth:`Actor.act` without the module calls (gSDE's
        head, whose noise reads the latent: :meth:`Actor.act`)."""
        if self.sde:
            return self.actor.act(obs)
        return self.actor.head.sample(self.policy_net.infer(self.actor.encoder(obs)))

    def _forward(self, x_pi: torch.Tensor, x_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """The policy's output and the values ``(B, 1)`` for encoded observations, and both networks' layer
        inputs (for :meth:`_backward`)."""
        if self.pair is not None:
            return self.pair.forward(x_pi)
        params, h_pi = self.policy_net.forward(x_pi)
        value, h_v = self.value_net.forward(x_v)
        return params, value, (h_pi, h_v)

    def _backward(self, inputs: Any, grad_params: torch.Tensor, grad_value: torch.Tensor) -> None:
        """Both networks' gradients from d(loss)/d(policy output) and d(loss)/d(values), into the flat buffer."""
        if self.pair is not None:
            self.pair.backward(inputs, grad_params, grad_value)
        else:
            h_pi, h_v = inputs
            self.policy_net.backward(h_pi, grad_params)
            self.value_net.backward(h_v, grad_value)

    def _terms(
        self, params: torch.Tensor, actions: torch.Tensor, inputs: Any
    ) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """The policy's log-probabilities, entropies and gradient terms for its output ``params`` and stored
        ``actions`` (in the head's form); ``inputs``: :meth:`_forward`'s (gSDE's terms read the latent)."""
        if self.sde:
            return self.actor.head.manual_terms(params, actions, inputs[0][-1])
        return self.actor.head.manual_terms(params, actions)

    @torch.no_grad()
    def evaluate(self, obs: ObsTensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Values and log-probabilities ``(B,)`` with the same arithmetic as the minibatch updates (so that
        the first update's probability ratios start at exactly 1)."""
        x_pi = self.actor.encoder(obs)
        x_v = x_pi if self.critic.encoder is self.actor.encoder else self.critic.encoder(obs)
        params, value, inputs = self._forward(x_pi, x_v)
        log_prob = self._terms(params, self.actor.head.manual_actions(actions), inputs)[0]
        return value.view(-1), log_prob

    @torch.no_grad()
    def value(self, obs: ObsTensor) -> torch.Tensor:
        """Values ``(B,)`` with the arithmetic of :meth:`evaluate`."""
        return self.value_net.forward(self.critic.encoder(obs))[0].view(-1)

    @staticmethod
    def applies(actor: Actor, critic: Critic, params: list[torch.Tensor]) -> bool:
        """Whether the networks are of the supported kind and ``params`` (what the optimizer steps) are
        exactly the trunk and head parameters that the hand-written gradients cover."""
        if actor.memory is not None or critic.memory is not None:
            return False
        if type(actor.head) not in ManualPPOUpdate.HEADS or type(critic.value_head) is not ScalarHead:
            return False
        if any(True for _ in actor.encoder.parameters()) or any(True for _ in critic.encoder.parameters()):
            return False
        if not ManualMLP.supports(actor.trunk, actor.head.proj):
            return False
        if not ManualMLP.supports(critic.trunk, critic.value_head.proj):
            return False
        covered = [*actor.trunk.parameters(), *actor.head.parameters(), *critic.trunk.parameters()]
        covered += list(critic.value_head.parameters())
        return len(covered) == len(params) and {id(p) for p in covered} == {id(p) for p in params}

    @torch.no_grad()
    def train(
        self,
        buffer: RolloutBuffer,
        optimizer: torch.optim.Optimizer,
        config: PPOConfig,
        clip_range: float,
        early_stop: Any = None,
        epoch_done: Any = None,
    ) -> tuple[dict[str, float], int]:
        """Run the epochs on the collected rollout: returns the minibatch statistics (as :func:`ppo_loss` names
        them) reduced as SB3 logs them, and the number of epochs started (an early stop ends one early, and
        calls ``early_stop(epoch, approx_kl)`` if given). ``epoch_done()`` is called as each epoch ends (an early
        stopped one too), where SB3 counts its updates, so an update interrupted midway has counted the epochs
        that changed the weights."""
        head = self.actor.head
        self.bind()
        flat = optimizer.flat_parameters
        n = buffer.n_steps * buffer.n_envs
        batch_size = min(config.batch_size, n)
        obs = buffer.flat_observations()
        # The encoders have no weights: encode the rollout once instead of every minibatch.
        x_pi = self.actor.encoder(obs)
        x_v = x_pi if self.critic.encoder is self.actor.encoder else self.critic.encoder(obs)
        rollout = (
            x_pi,
            x_v,
            head.manual_actions(buffer.flat_actions()),
            buffer.log_probs_tensor.reshape(n),
            buffer.advantages_tensor.reshape(n),
            buffer.returns_tensor.reshape(n, 1),  # (n, 1) as the values
        )
        # Per-sample terms of every minibatch, reduced to the logged statistics once at the end.
        log_ratios, s1s, s2s, errors, entropies, used = [], [], [], [], [], []
        low, high = 1.0 - clip_range, 1.0 + clip_range
        ent_coef, vf_coef, target_kl = config.ent_coef, config.vf_coef, config.target_kl
        epochs = 0
        stop = False
        shuffle = batch_size < n
        if not shuffle:
            # One minibatch holds the whole rollout: its order does not change the gradient, so every epoch
            # takes the rollout as it is.
            whole = (
                *rollout[:4],
                self._scaled_advantages(rollout[4], batch_size, config.normalize_advantage),
                rollout[5],
            )
        last_epoch = 0  # the index of the last epoch's first minibatch
        for _ in range(config.n_epochs):
            epochs += 1
            last_epoch = len(used)
            if shuffle:
                # One permutation per epoch; the minibatches are contiguous parts of the permuted rollout, split
                # once per epoch (views).
                epoch = _permute(rollout, torch.randperm(n, device=x_pi.device))
                adv_e = self._scaled_advantages(epoch[4], batch_size, config.normalize_advantage)
                minibatches = zip(*_split((*epoch[:4], adv_e, epoch[5]), batch_size))
            else:
                minibatches = (whole,)
            for x_pi_b, x_v_b, act_b, old_b, adv_b, ret_b in minibatches:
                size = ret_b.shape[0]
                params, value, inputs = self._forward(x_pi_b, x_v_b)
                log_prob, entropy, terms = self._terms(params, act_b, inputs)
                log_ratio = log_prob - old_b
                ratio = log_ratio.exp()
                # adv_b is -A / size: the minus of the loss and the 1 / size of its mean folded in
                s1 = ratio * adv_b
                s2 = ratio.clamp(low, high).mul_(adv_b)
                error = value - ret_b  # (B, 1)
                log_ratios.append(log_ratio)
                s1s.append(s1)
                s2s.append(s2)
                errors.append(error)
                entropies.append(entropy)
                used.append(size)
                if target_kl is not None:
                    approx_kl = ((ratio - 1) - log_ratio).mean().item()
                    if approx_kl > 1.5 * target_kl:
                        if early_stop is not None:
                            early_stop(epochs - 1, approx_kl)
                        stop = True
                        break
                # policy loss = sum(max(s1, s2)) over the minibatch; its gradient flows through the unclipped
                # term where that one is selected (ties: the ratio is inside the clip range).
                grad_log_prob = torch.where(s1 >= s2, s1, 0.0)
                grad_params = head.manual_grad(terms, grad_log_prob, -ent_coef / size)
                self._backward(inputs, grad_params, error.mul(2.0 * vf_coef / size))
                flat.clip_grad_norm_(config.max_grad_norm)
                flat.step(optimizer)
            if epoch_done is not None:
                epoch_done()
            if stop:
                break
        stash = {"log_ratio": log_ratios, "s1": s1s, "s2": s2s, "error": errors, "entropy": entropies}
        return self._means(stash, used, last_epoch, clip_range, ent_coef, vf_coef), epochs

    @staticmethod
    def _scaled_advantages(adv: torch.Tensor, batch_size: int, normalize: bool) -> torch.Tensor:
        """``-A / size`` per sample, ``A`` normalized within each minibatch of one epoch's order."""
        n = adv.shape[0]
        full = n // batch_size * batch_size
        parts = [adv[:full].view(-1, batch_size)]  # (n_minibatches, batch_size)
        if full < n:
            parts.append(adv[full:].view(1, -1))  # the truncated last minibatch
        out = []
        for part in parts:
            size = part.shape[1]
            if normalize and size > 1:
                std, mean = torch.std_mean(part, dim=1, keepdim=True)
                part = (part - mean) / (std + 1e-8)
            out.append(part.reshape(-1) * (-1.0 / size))
        return out[0] if len(out) == 1 else torch.cat(out)

    @staticmethod
    def _means(stash: dict[str, list[torch.Tensor]], sizes: list[int], last_epoch: int, clip_range, ent_coef, vf_coef):
        """The logged statistics of :func:`ppo_loss` as SB3 reduces them (:func:`sb3_train_log`): means over the
        minibatches, ``approx_kl`` over those of the last epoch (from index ``last_epoch``), ``loss`` the last
        minibatch's."""
        if not sizes:
            return {}
        cat = {key: torch.cat(values).view(-1) for key, values in stash.items()}
        sizes_t = torch.tensor(sizes, dtype=cat["s1"].dtype, device=cat["s1"].device)
        segment = torch.repeat_interleave(torch.arange(len(sizes), device=sizes_t.device), sizes_t.long())
        ratio = cat["log_ratio"].exp()
        per_sample = torch.stack(
            [
                torch.maximum(cat["s1"], cat["s2"]),  # s1, s2 carry -1 / size already
                cat["error"].square(),
                -cat["entropy"],
                (ratio - 1) - cat["log_ratio"],
                ((ratio - 1).abs() > clip_range).to(ratio.dtype),
            ]
        )
        per_sample[1:] /= sizes_t[segment]
        per_batch = per_sample.new_zeros(5, len(sizes)).index_add_(1, segment, per_sample)  # (5, minibatches)
        names = ("policy_gradient_loss", "value_loss", "entropy_loss", "approx_kl", "clip_fraction")
        history = [dict(zip(names, column)) for column in per_batch.T.tolist()]
        for stats in history:
            stats["loss"] = (
                stats["policy_gradient_loss"] + ent_coef * stats["entropy_loss"] + vf_coef * stats["value_loss"]
            )
        return sb3_train_log(history, last_epoch)


def sb3_train_log(history: list[dict[str, Any]], last_epoch: int) -> dict[str, float]:
    """Minibatch statistics reduced as SB3's PPO logs them: each one's mean over the update's minibatches, but
    ``approx_kl`` over the minibatches of the last epoch (``history[last_epoch:]``; with an early stop, up to
    the one that stopped it) and ``loss`` the last minibatch's."""
    if not history:
        return {}
    values = {key: [float(stats[key]) for stats in history] for key in history[0]}
    out = {key: float(np.mean(column)) for key, column in values.items()}
    if "approx_kl" in out:
        out["approx_kl"] = float(np.mean(values["approx_kl"][last_epoch:]))
    if "loss" in out:
        out["loss"] = values["loss"][-1]
    return out


class NumpyActing:
    """Acting in NumPy for the networks of :class:`ManualPPOUpdate` on a CPU: the actor's forward on a batch
    of vector observations and a sampled action per row, reading the live weights through NumPy views.

    An env step's batch is a few rows, where each PyTorch operation costs its fixed dispatch overhead (a few
    us) and NumPy's a fraction of it: acting on one CartPole observation takes about a quarter of the time of
    the same operations in PyTorch. The forward is the modules' (float32, ``np.tanh`` / ReLU); actions are
    sampled with NumPy's global generator (which ``seed=`` seeds, as it seeds PyTorch's): a Discrete action
    by Gumbel-max over the logits, a Box action as ``mean + std * N(0, 1)``; with ``use_sde`` as ``mean + latent
    @ E``, from the exploration matrices that ``reset_noise`` drew in PyTorch (nothing is drawn here). Training
    is unchanged: the rollout's log-probabilities are computed in PyTorch after it
    (:meth:`ManualPPOUpdate.evaluate`).

    It applies (:meth:`applies`) to float32 CPU networks behind a plain :class:`FlattenEncoder` (Box or
    MultiBinary observations, no scaling), or one behind running statistics of the whole observation
    (``normalize_observations``), which it standardizes as :class:`RunningNormalizer` does, in float32.
    """

    def __init__(self, actor: Actor, net: ManualMLP) -> None:
        # Views of the parameters' memory: the optimizer updates them in place, and these follow.
        normalizer = self._normalizer(actor)
        # the statistics' buffers, which change in place (their update, load_state_dict) as the weights do
        self.statistics = (
            None if normalizer is None else (normalizer.mean.numpy(), normalizer.var.numpy(), normalizer.count.numpy())
        )
        self.eps, self.clip = (1e-8, 10.0) if normalizer is None else (normalizer.eps, normalizer.clip)
        self.weights_t = [weight_t.numpy() for weight_t in net.weights_t]  # (in, out)
        self.biases = [bias.numpy() for bias in net.biases]
        self.kinds = net.kinds
        head = actor.head
        self.head = head
        self.categorical = isinstance(head, CategoricalHead)
        self.sde = type(head) is StateDependentGaussianHead  # noise from its exploration matrices, read per call
        self.start = head.start if self.categorical else 0
        self.log_std = None if self.categorical or self.sde else head.log_std.detach().numpy()

    @staticmethod
    def _normalizer(actor: Actor) -> RunningNormalizer | None:
        """The running statistics in front of the actor's flattening encoder, if any."""
        encoder = actor.encoder
        return encoder.normalizer if type(encoder) is NormalizedEncoder else None

    @staticmethod
    def applies(actor: Actor, manual: ManualPPOUpdate | None) -> bool:
        encoder, normalizer = actor.encoder, NumpyActing._normalizer(actor)
        if normalizer is not None:  # (on the weights' device, which the check below puts on the CPU)
            if type(normalizer) is not RunningNormalizer or normalizer.positions is not None:
                return False
            encoder = encoder.encoder
        if manual is None or type(encoder) is not FlattenEncoder or encoder.scale is not None:
            return False
        weights = [*manual.policy_net.weights, *manual.policy_net.biases]
        if type(actor.head) in (DiagGaussianHead, StateDependentGaussianHead):
            weights.append(actor.head.log_std)
        return all(w.device.type == "cpu" and w.dtype == torch.float32 for w in weights)

    def forward(self, obs: np.ndarray) -> np.ndarray:
        """Logits or means ``(B, out)`` for a batch of observations, as float32."""
        return self._output(self._latent(obs))

    def _latent(self, obs: np.ndarray) -> np.ndarray:
        """The trunk's output ``(B, hidden)`` for a batch of observations."""
        h = obs.reshape(obs.shape[0], self.weights_t[0].shape[0]).astype(np.float32, copy=False)  # B may be 0
        if self.statistics is not None and self.statistics[2] > 0:  # standardized as RunningNormalizer.forward does
            mean, var, _ = self.statistics
            scale = 1.0 / np.sqrt(var.astype(np.float32).reshape(-1) + np.float32(self.eps))
            h = np.clip((h - mean.astype(np.float32).reshape(-1)) * scale, -self.clip, self.clip, dtype=np.float32)
        for weight_t, bias, kind in zip(self.weights_t, self.biases, self.kinds):
            h = h @ weight_t
            h += bias
            if kind == "tanh":
                np.tanh(h, out=h)
            else:
                np.maximum(h, 0.0, out=h)
        return h

    def _output(self, latent: np.ndarray) -> np.ndarray:
        out = latent @ self.weights_t[-1]
        out += self.biases[-1]
        return out

    def act(self, obs: np.ndarray) -> np.ndarray:
        """A sampled action per observation: ``(B,)`` int64 for Discrete, ``(B, d)`` float32 for Box."""
        if self.sde:  # as StateDependentGaussianHead.sample: mean + latent @ E, E drawn by reset_noise (no draw here)
            head, latent = self.head, self._latent(obs)
            out = self._output(latent)
            if head.exploration is None:
                head.reset_noise()
            if head.explorations is not None and len(latent) == len(head.explorations) > 1:  # each row its own E
                return out + np.matmul(latent[:, None, :], head.explorations.detach().numpy())[:, 0]
            return out + latent @ head.exploration.detach().numpy()
        out = self.forward(obs)
        if self.categorical:
            # Gumbel-max: -log(E), E ~ Exp(1), is Gumbel noise; E is kept above 0 (log(0)).
            noise = np.random.standard_exponential(out.shape)
            np.log(np.maximum(noise, 1e-20, out=noise), out=noise)
            return (out - noise).argmax(-1) + self.start
        noise = np.random.standard_normal(out.shape).astype(np.float32)
        noise *= np.exp(self.log_std)
        return out + noise


def check_rollout_buffer_args(rollout_buffer_class: Any, rollout_buffer_kwargs: dict | None) -> None:
    """SB3's own rollout buffer classes (``RolloutBuffer``, ``DictRolloutBuffer``, by name) stand for covey's
    buffer, which stores either kind of observation; other classes, and keyword arguments, are refused."""
    name = getattr(rollout_buffer_class, "__name__", None)
    module = getattr(rollout_buffer_class, "__module__", "")
    sb3_own = name in ("RolloutBuffer", "DictRolloutBuffer") and module.startswith("stable_baselines3.")
    if rollout_buffer_class is not None and not sb3_own:
        raise NotImplementedError(
            f"rollout_buffer_class={rollout_buffer_class!r} is not supported: covey's PPO stores rollouts in its "
            "own buffer (SB3's RolloutBuffer and DictRolloutBuffer stand for it). Remove rollout_buffer_class."
        )
    if rollout_buffer_kwargs:
        raise NotImplementedError(
            f"rollout_buffer_kwargs={rollout_buffer_kwargs!r} is not supported: covey's rollout buffer takes its "
            "settings from PPO's own arguments (n_steps, gamma, gae_lambda). Remove rollout_buffer_kwargs."
        )


def print_early_stop(epoch: int, approx_kl: float) -> None:
    """SB3's message for an update stopped by ``target_kl`` (``verbose >= 1``), printed as SB3 prints it."""
    print(f"Early stopping at step {epoch} due to reaching max kl: {approx_kl:.2f}")


class PPO(BaseAgent):
    """Proximal Policy Optimization with the Stable-Baselines3 interface.

    Constructor arguments, defaults, ``learn``/``predict``/``save``/``load``, callbacks and logger keys
    follow ``stable_baselines3.PPO``. Actor and critic are separate networks (``model.actor``,
    ``model.critic``); ``model.policy`` holds both with SB3's ``ActorCriticPolicy`` calls
    (:class:`~covey.networks.policies.ActorCriticPolicy`). A user's subclass of SB3's ``ActorCriticPolicy`` as
    ``policy`` is built and trained through SB3's policy calls instead (:mod:`covey.agents.sb3_policy`):
    ``model.policy`` is then the SB3 policy, and ``model.actor`` and ``model.critic`` are None. Each argument is
    described in :class:`PPOConfig`.

    >>> from covey import PPO
    >>> model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, seed=0).learn(128)
    >>> model.num_timesteps
    128
    """

    agent_name = "PPO"
    _sb3_optimizers = ("policy.optimizer",)
    schedule_keys = ("learning_rate", "clip_range", "clip_range_vf")
    config_class = PPOConfig
    policy_aliases = PolicyAliases("covey.ppo.policies")
    own_attributes = frozenset({"clip_range", "clip_range_vf"})
    built_from = {"n_steps": "the rollout buffer", "use_sde": "the policy's action distribution"}
    manual_gradients: ClassVar[bool] = True
    """Train MLP networks with :class:`ManualPPOUpdate` where it applies (set ``PPO.manual_gradients = False``
    before building a model to use autograd for every network)."""
    numpy_acting: ClassVar[bool] = True
    """Act with :class:`NumpyActing` where it applies (set ``PPO.numpy_acting = False`` before building a model
    to act in PyTorch, with PyTorch's random generator)."""
    # SB3's attributes for what covey fixes: its own rollout buffer, and no action noise for an on-policy agent.
    rollout_buffer_class: ClassVar[type] = RolloutBuffer
    action_noise: ClassVar[None] = None

    @property
    def rollout_buffer_kwargs(self) -> dict:
        return {}

    def __init__(
        self,
        policy: str,
        env: Any,
        learning_rate: Schedule = 3e-4,
        n_steps: int = 2048,
        batch_size: int = 64,
        n_epochs: int = 10,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        clip_range: Schedule = 0.2,
        clip_range_vf: Schedule | None = None,
        normalize_advantage: bool = True,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float = 0.5,
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        rollout_buffer_class: type | None = None,
        rollout_buffer_kwargs: dict | None = None,
        target_kl: float | None = None,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: torch.device | str = "auto",
        _init_setup_model: bool = True,
    ) -> None:
        check_rollout_buffer_args(rollout_buffer_class, rollout_buffer_kwargs)
        self.config = PPOConfig(
            learning_rate=learning_rate,
            n_steps=n_steps,
            batch_size=batch_size,
            n_epochs=n_epochs,
            gamma=gamma,
            gae_lambda=gae_lambda,
            clip_range=clip_range,
            clip_range_vf=clip_range_vf,
            normalize_advantage=normalize_advantage,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,
            target_kl=target_kl,
            stats_window_size=stats_window_size,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
        )
        self._sb3_policy_class = sb3_policy_class(policy)
        if self._sb3_policy_class is not None:
            # the class takes policy_kwargs itself; covey's own networks and their settings are not built
            self.policy_config = PolicyConfig()
            policy = "MlpPolicy"
        else:
            self.policy_config = PolicyConfig.from_kwargs(policy_kwargs, refused=SAC_ONLY_KWARGS)
        self.policy_config.use_sde = bool(use_sde)
        if self.policy_config.squash_output and not use_sde:
            raise ValueError(
                "policy_kwargs squash_output=True squashes the actions of state-dependent exploration, so it needs "
                "use_sde=True (as in SB3): pass use_sde=True, or remove squash_output (Box actions are then "
                "clipped to the bounds)."
            )
        super().__init__(
            policy, env, learning_rate, policy_kwargs, stats_window_size, tensorboard_log, verbose, device, seed
        )
        if self.device.type != "cpu" and self.policy_name == "MlpPolicy":
            # as SB3 recommends for its PPO; covey's CPU paths (NumPy acting, hand-written gradients) widen the gap
            warn_user(
                f"PPO with an MlpPolicy on {self.device}: small MLPs train faster on the CPU, where covey acts in "
                "NumPy and computes the update's gradients by hand, than on a GPU, where every env step waits on "
                "a device round trip. Pass device='cpu' (the model trains on the GPU too, slowly)."
            )
        if self.env is not None:  # in the constructor, as SB3's: not again in load(path, env=...)
            self._warn_batch_layout()
        if _init_setup_model:
            self._setup_model()

    def _warn_batch_layout(self) -> None:
        warn_batch_size(self.config.batch_size, self.config.n_steps * self.n_envs)

    def _attach_env(self, env) -> None:
        if self.policy_config.squash_output:
            check_finite_bounds(env.action_space, "PPO with squash_output=True")
        super()._attach_env(env)

    def _cpu_only(self) -> str | None:
        if memory_settings(self.policy_name, self.policy_config) is not None:
            return "PPO with a recurrent policy keeps its memories on the CPU"
        return None

    def _setup_model(self) -> None:
        self._require_spaces()
        cfg = self.config
        buffer_size = cfg.n_steps * self.n_envs
        if cfg.normalize_advantage and buffer_size <= 1:
            raise ValueError(
                f"n_steps * n_envs = {buffer_size}: advantage normalization needs at least 2 samples per rollout. "
                "Raise n_steps or set normalize_advantage=False."
            )
        self.set_random_seed(self.seed)
        if self._sb3_policy_class is not None:
            self._setup_sb3_policy()
            return
        self._sb3_trainer = None
        self.actor, self.critic = build_actor_critic(
            self.policy_name, self.observation_space, self.action_space, self.policy_config
        )
        self.actor.to(self.device)
        self.critic.to(self.device)
        self.policy = ActorCriticPolicy(self.actor, self.critic, self)  # SB3's model.policy over both networks
        self.policy.config = self.policy_config
        pc = self.policy_config
        if pc.value_head == "twohot" and self.clip_range_vf is not None:
            raise ValueError(
                "clip_range_vf does not apply to the two-hot value head (its cross-entropy loss is already "
                "bounded and scale-free); remove clip_range_vf or use value_head='scalar'."
            )
        self.critic_ema = CriticEMA(self.critic, pc.critic_ema_decay) if pc.critic_ema_decay is not None else None
        # Unique parameters of both networks (a shared encoder appears in both modules).
        params = list({id(p): p for p in [*self.actor.parameters(), *self.critic.parameters()]}.values())
        self._params = params
        # model.policy.optimizer as in SB3 (one optimizer steps the actor and the critic)
        self.optimizer = self.policy.optimizer = self._make_optimizer(params, adam_eps=PPO_ADAM_EPS)
        self._manual: ManualPPOUpdate | None = None
        if (
            self.manual_gradients
            and self.clip_range_vf is None
            and self.critic_ema is None
            and ManualPPOUpdate.applies(self.actor, self.critic, params)
        ):
            self._manual = ManualPPOUpdate(self.actor, self.critic)
        self._hooked = False  # a module or gradient hook: the hand-written passes stand aside (collect_rollouts)
        self._numpy_acting: NumpyActing | None = None
        if self.numpy_acting and NumpyActing.applies(self.actor, self._manual):
            self._numpy_acting = NumpyActing(self.actor, self._manual.policy_net)
        # An encoder with weights (a CNN, an SB3 features extractor) is the costly part of every pass: acting
        # then also gives the values and log-probs (one pass over each step, as SB3 does) instead of a second
        # pass over the rollout. Weight-free encoders keep the one batched pass after the rollout.
        self._evaluate_while_acting = (
            self._manual is None
            and self.actor.memory is None
            and any(True for _ in [*self.actor.encoder.parameters(), *self.critic.encoder.parameters()])
        )
        self.rollout_buffer = RolloutBuffer(
            cfg.n_steps, self.n_envs, self.observation_space, self.action_space, self.device
        )
        memory = memory_settings(self.policy_name, pc)
        self.recurrent: RecurrentRollout | None = None
        if memory is not None:
            self.recurrent = RecurrentRollout(
                self.actor, self.critic, cfg.n_steps, self.n_envs, int(memory["sequence_length"])
            )

    def _setup_sb3_policy(self) -> None:
        """A user's SB3 policy class (:mod:`covey.agents.sb3_policy`): ``model.policy`` is the SB3 policy, built
        and trained through SB3's calls, in covey's rollout buffer and loop."""
        self._sb3_trainer = SB3PolicyTrainer(self._build_sb3_policy(), self.observation_space, self.action_space)
        self.policy = self._sb3_trainer.policy
        self.actor = self.critic = self.critic_ema = None
        self._manual, self._numpy_acting, self.recurrent = None, None, None
        self._hooked = False
        self._params = list(self.policy.parameters())
        self.rollout_buffer = RolloutBuffer(
            self.config.n_steps, self.n_envs, self.observation_space, self.action_space, self.device
        )
        self.rollout_buffer.policy_action_start = self._sb3_trainer.start

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer of the actor and the critic: SB3's ``model.policy.optimizer``."""
        return self.policy.optimizer if self._sb3_policy_class is not None else self._optimizer

    @optimizer.setter
    def optimizer(self, value: torch.optim.Optimizer) -> None:
        if self._sb3_policy_class is not None:
            self.policy.optimizer = value
        else:
            self._optimizer = value

    def _rollout_observations(self) -> Any:
        return self.rollout_buffer.flat_observations()

    def _networks(self) -> dict[str, torch.nn.Module]:
        if self._sb3_policy_class is not None:
            return {"policy": self.policy}
        networks = {"actor": self.actor, "critic": self.critic}
        if self.critic_ema is not None:
            networks["critic_ema"] = self.critic_ema.model
        return networks

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    def _optimizer_slots(self) -> list[tuple[str, Any, Any]]:
        if self._sb3_policy_class is not None:
            return []  # the SB3 policy's optimizer is stepped wherever it is, as SB3 steps it
        return [("policy.optimizer", self.policy.optimizer, self.optimizer)]

    def _parameter_groups(self) -> dict[str, Any]:
        groups = {"policy": self.policy, "policy.optimizer": self.optimizer}  # SB3's names
        if self.critic_ema is not None:
            groups["critic_ema"] = self.critic_ema.model
        return groups

    def _translate_parameter_names(self, params: dict) -> dict:
        if self._sb3_policy_class is not None:
            return params  # SB3's names are the model's own
        params = merge_parameter_groups(params, "policy", ("actor", "critic"), {"optimizer": "policy.optimizer"})
        return translate_groups("PPO", params, self._sb3_optimizers, self._flat_image(), self._sb3_optimizer_state)

    # ------------------------------------------------------------------ training loop
    def learn(
        self,
        total_timesteps: int,
        callback: Any = None,
        log_interval: int = 1,
        tb_log_name: str = "PPO",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> PPO:
        """Collect rollouts and update until ``total_timesteps`` env steps (over all envs); returns self."""
        return self._learn_on_policy(
            total_timesteps, callback, log_interval, tb_log_name, reset_num_timesteps, progress_bar
        )

    def _before_rollout(self) -> None:
        # A subclass's collect_rollouts that is SB3's calls rollout_buffer.compute_returns_and_advantage, which
        # computes with the buffer's gamma and gae_lambda, as SB3's buffer does: the model's.
        self.rollout_buffer.gamma, self.rollout_buffer.gae_lambda = self.config.gamma, self.config.gae_lambda
        self._value_entropy = None  # a two-hot critic's, which covey's collect_rollouts measures

    def collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """SB3's: fill the rollout buffer with ``n_rollout_steps`` steps of every env (the model's env, buffer and
        ``n_steps``, which a subclass's override passes on); False when a callback stops training."""
        # Callbacks read these locals by SB3's names: rollout_buffer, n_rollout_steps, n_steps (the step).
        self._check_collection(env, rollout_buffer, "rollout_buffer", n_rollout_steps)
        actor = self.actor
        space = self.observation_space
        rollout_buffer.reset()
        self._set_training_mode(False)  # both networks act and value the rollout in evaluation mode, as in SB3
        use_sde, sde_sample_freq = self.config.use_sde, self.config.sde_sample_freq
        if use_sde:  # as SB3: exploration matrices for the rollout (one per env)
            self._reset_noise(env.num_envs)
        callback.on_rollout_start()
        self._relink_parameters()  # a callback's vector_to_parameters or p.data = ... acts from this step
        # and, where a callback of the user's runs between steps, from the next step
        take_back = self._take_back_replaced_parameters if self._runs_user_code(callback) else None
        truncations: list[tuple[int, int, Any]] = []
        acted: list[tuple[torch.Tensor, torch.Tensor]] = []  # (critic's raw output, log-prob) per step
        # Values and old log-probs come after the rollout; where a callback of the user's changes the weights
        # between steps (an exploration schedule on log_std, load_state_dict), the steps before the change are
        # evaluated with the weights they acted with first, as SB3 stores each step's as it acts.
        watch = WeightWatch(self._flat_parameters()) if take_back is not None else None
        earlier = _Evaluated()
        new_obs = self._last_obs
        trainer = self._sb3_trainer  # a user's SB3 policy class acts and gives values through it
        self._hooked = trainer is None and has_hooks(actor, self.critic)
        numpy_acting = None if self._hooked else self._numpy_acting
        for n_steps in range(n_rollout_steps):
            if use_sde and sde_sample_freq > 0 and n_steps % sde_sample_freq == 0:
                self._reset_noise(env.num_envs)
            if numpy_acting is not None:
                # Acting and storing in NumPy (the buffer takes the arrays as they are); obs_tensor, a view of the
                # observations as SB3 makes it, is there for callbacks' locals
                obs_tensor = torch.as_tensor(self._last_obs)
                stored_obs = self._last_obs
                actions = stored_actions = numpy_acting.act(self._last_obs)
            else:
                stored_obs = obs_tensor = batch_to_tensor(self._last_obs, space, self.device)
                stored_actions = self._act(obs_tensor, n_steps, acted)
                if trainer is not None:  # SB3's locals: the step's values (n_envs, 1) and log-probs
                    values, log_probs = acted[-1][0].reshape(-1, 1), acted[-1][1]
                actions = stored_actions.cpu().numpy()  # numpy in callbacks' locals, as in SB3
            actions = actions.reshape((-1, *self.action_space.shape))  # callbacks see SB3's shape (a view)
            clipped_actions = actor.to_env_actions(actions) if trainer is None else trainer.env_actions(actions)
            stopped = True
            try:
                new_obs, rewards, dones, infos = env.step(clipped_actions)
                self.num_timesteps += env.num_envs
                if self.recurrent is not None:  # sb3-contrib's locals: the step's episode starts, its memory after
                    episode_starts = torch.as_tensor(self._last_episode_starts, dtype=torch.float32)
                    lstm_states = RNNStates(self.recurrent.actor_state)
                callback.update_locals(locals())
                stopped = not callback.on_step()
                if take_back is not None:
                    take_back()
                changed = watch is not None and watch.changed()
            finally:  # a callback's stop, or an env's or a callback's exception or an interrupt (then raised)
                if stopped and self.recurrent is not None:  # memories as after the steps stored (this one is redone)
                    self.recurrent.stop_at(self.critic, rollout_buffer, n_steps)
            if stopped:
                return False
            self._update_info_buffer(infos, dones)
            terminated = dones.copy()
            for i in np.flatnonzero(dones):
                final_obs = infos[i].get("terminal_observation")
                if final_obs is not None:
                    check_terminal_observation(final_obs, new_obs, i)
                if infos[i].get("TimeLimit.truncated", False) and final_obs is not None:
                    # A time limit is not a terminal: bootstrap from V(true final observation).
                    terminated[i] = False
                    truncations.append((n_steps, int(i), final_obs))
            rollout_buffer.add(stored_obs, stored_actions, rewards, terminated, dones, self._last_episode_starts)
            self._last_obs = new_obs
            self._last_episode_starts = np.asarray(dones, dtype=bool)  # a VecEnv may give 0/1 ints
            if changed and self.recurrent is not None:
                watch.take_new_weights()
                warn_weights_changed_in_rollout("A recurrent PPO")
            elif changed:  # steps up to this one acted with the weights before the callback's change
                with watch.earlier_weights():  # (this step's truncations are valued after its callbacks, by the new)
                    self._evaluate_steps(earlier, n_steps + 1, n_steps, truncations, acted)
        check_finite(
            "in this rollout",
            observations=(rollout_buffer.observations_tensor, new_obs, [obs for _, _, obs in truncations]),
            rewards=rollout_buffer.rewards,
        )
        check_discrete_observations(
            "in this rollout", (rollout_buffer.observations_tensor, new_obs), self.observation_space
        )
        last_values = self._evaluate_rollout(new_obs, truncations, acted, earlier)
        rollout_buffer.compute_returns(last_values, self.config.gamma, self.config.gae_lambda)
        n_steps = n_rollout_steps  # SB3's count at the rollout's end (steps 0 .. n - 1 while stepping)
        values = torch.as_tensor(last_values).reshape(-1, 1)  # as SB3's locals: V(last observations)
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def _set_training_mode(self, mode: bool) -> None:
        if self._sb3_trainer is not None:
            self.policy.set_training_mode(mode)
        else:
            set_train_mode(self.actor, mode)
            set_train_mode(self.critic, mode)
            self.policy.training = mode  # the SB3 view's own flag, which callbacks read

    def _reset_noise(self, n_envs: int) -> None:
        """New gSDE exploration matrices, one per env."""
        if self._sb3_trainer is not None:
            self.policy.reset_noise(n_envs)
        else:
            self.actor.head.reset_noise(n_envs)

    def _act(self, obs_tensor: ObsTensor, step: int, acted: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Actions for a step's observations in PyTorch. Acting needs only the actor; values and log-probs come
        in one pass after the rollout, or with the action for encoders with weights (appended to ``acted``)."""
        actor = self.actor
        if self._sb3_trainer is not None:
            actions, values, log_probs = self._sb3_trainer.act(obs_tensor)
            acted.append((values, log_probs))
            return actions
        if self.recurrent is not None:
            return self.recurrent.act(actor, obs_tensor, self._last_episode_starts, step)
        with torch.no_grad() if self._hooked else torch.inference_mode():  # a hook keeps ordinary tensors, as in SB3
            if self._manual is not None and not self._hooked:
                return self._manual.act(obs_tensor)
            if self._evaluate_while_acting:
                params, raw = actor_critic_forward(actor, self.critic, obs_tensor)
                action_tensor = actor.head.sample(params)
                acted.append((raw, actor.head.log_prob(params, action_tensor)))
                return action_tensor
            return actor(obs_tensor) if self._hooked else actor.act(obs_tensor)  # a hook on the actor runs

    @torch.no_grad()
    def _evaluate_rollout(
        self,
        last_obs: Any,
        truncations: list[tuple[int, int, Any]],
        acted: list[tuple[torch.Tensor, torch.Tensor]],
        earlier: _Evaluated | None = None,
    ) -> np.ndarray:
        """Values and old log-probs of the whole rollout in batched passes (parameters are unchanged
        since acting), or from ``acted``, the critic's raw outputs and the log-probs computed with each
        action; returns V(last observation) per env and fills the truncation bootstraps. ``earlier`` holds the
        steps already evaluated with the weights they acted with (see :meth:`_evaluate_steps`)."""
        buffer = self.rollout_buffer
        if self.recurrent is not None:
            last_values, self._value_entropy = self.recurrent.evaluate(
                self.actor,
                self.critic,
                buffer,
                last_obs,
                self._last_episode_starts,
                truncations,
                self.observation_space,
            )
            return last_values
        earlier = earlier if earlier is not None else _Evaluated()
        self._evaluate_steps(earlier, buffer.n_steps, buffer.n_steps, truncations, acted)
        head = self.critic.value_head if self._sb3_trainer is None else None  # an SB3 policy gives values
        self._value_entropy = None
        if acted:  # the critic's raw outputs (values, or two-hot logits) of the whole rollout, per step
            raw = torch.cat([raw for raw, _ in acted])
            values, log_probs = raw if head is None else head.value(raw), torch.cat([lp for _, lp in acted])
            raws = [raw]
        else:
            values, log_probs, raws = torch.cat(earlier.values), torch.cat(earlier.log_probs), earlier.raws
        if raws and head is not None and head.distributional:
            self._value_entropy = head.entropy(torch.cat(raws)).mean().item()
        buffer.values_tensor = values.reshape(buffer.n_steps, buffer.n_envs)
        buffer.log_probs_tensor = log_probs.reshape(buffer.n_steps, buffer.n_envs)
        return self._critic_values(last_obs)

    def _critic_values(self, obs: Any) -> np.ndarray:
        """V(obs) for a batch of env observations, as the rollout's values are computed."""
        manual = None if self._hooked else self._manual
        trainer = self._sb3_trainer
        critic = manual.value if manual is not None else self.critic if trainer is None else trainer.values
        return critic(batch_to_tensor(obs, self.observation_space, self.device)).cpu().numpy()

    @torch.no_grad()
    def _evaluate_steps(
        self,
        earlier: _Evaluated,
        end: int,
        truncated_until: int,
        truncations: list[tuple[int, int, Any]],
        acted: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        """Evaluate the stored steps from ``earlier.end`` up to ``end`` (exclusive) with the weights in place:
        their values and old log-probs (unless ``acted`` holds them, computed with each action), and the
        bootstraps of the truncations at steps before ``truncated_until`` (SB3 values a truncation after its
        step's callbacks), in batched passes."""
        buffer, n_envs = self.rollout_buffer, self.rollout_buffer.n_envs
        first = earlier.end
        if not acted and end > first:
            manual = None if self._hooked else self._manual
            # The hand-differentiated update evaluates with its own arithmetic, so that both agree exactly.
            obs, actions = buffer.flat_observations(), buffer.flat_actions()
            for start in range(first * n_envs, end * n_envs, _EVAL_CHUNK):
                stop = min(start + _EVAL_CHUNK, end * n_envs)
                chunk, chunk_actions = _slice(obs, start, stop), actions[start:stop]
                if manual is not None:
                    value, log_prob = manual.evaluate(chunk, chunk_actions)
                    earlier.values.append(value)
                else:
                    params, raw = actor_critic_forward(self.actor, self.critic, chunk)
                    earlier.raws.append(raw)
                    head = self.critic.value_head
                    earlier.values.append(head.value(raw))
                    log_prob = self.actor.evaluate_params(params, chunk_actions)[0]
                earlier.log_probs.append(log_prob)
        earlier.end = end
        pending = [t for t in truncations if earlier.truncated_until <= t[0] < truncated_until]
        if pending:
            bootstrap = self._critic_values(_stack_obs([obs_i for _, _, obs_i in pending]))
            for (step, env_idx, _), value in zip(pending, bootstrap):
                buffer.truncation_values[step, env_idx] = value
        earlier.truncated_until = truncated_until

    def _count_update(self) -> None:
        self._n_updates += 1

    def train(self) -> None:
        """Several epochs of minibatch updates on the collected rollout."""
        cfg = self.config
        progress = self._current_progress_remaining
        self._relink_parameters()
        self._update_learning_rate(self.policy.optimizer)  # SB3's call, which a subclass's override takes
        name = type(self).__name__
        clip_range = scheduled(self.clip_range, progress, name, "clip_range")
        vf = self.clip_range_vf
        clip_range_vf = None if vf is None else scheduled(vf, progress, name, "clip_range_vf")
        self._set_training_mode(True)
        if self._manual is not None and not has_hooks(self.actor, self.critic):
            early_stop = print_early_stop if self.verbose >= 1 else None
            means, _ = self._manual.train(
                self.rollout_buffer, self.optimizer, cfg, clip_range, early_stop, epoch_done=self._count_update
            )
            self._record_train_means(means, clip_range, clip_range_vf)
            return
        history: list[dict[str, torch.Tensor]] = []
        continue_training = True
        ema = self.critic_ema.model if self.critic_ema is not None else None
        last_epoch = 0  # the index in history of the last epoch's first minibatch
        for epoch in range(cfg.n_epochs):
            last_epoch = len(history)
            for batch in self._minibatches():
                if self.recurrent is not None:
                    log_prob, entropy, raw, ema_raw, flat = self.recurrent.outputs(
                        self.actor, self.critic, ema, self.rollout_buffer, batch
                    )
                    loss, stats = ppo_objective(
                        log_prob,
                        entropy,
                        raw,
                        self.critic.value_head,
                        flat,
                        clip_range,
                        clip_range_vf,
                        cfg.ent_coef,
                        cfg.vf_coef,
                        cfg.normalize_advantage,
                        ema_raw,
                        self.policy_config.critic_ema_coef,
                    )
                elif self._sb3_trainer is not None:
                    values, log_prob, entropy = self._sb3_trainer.evaluate(batch.observations, batch.actions)
                    loss, stats = ppo_objective(
                        log_prob,
                        entropy,
                        values,
                        None,
                        batch,
                        clip_range,
                        clip_range_vf,
                        cfg.ent_coef,
                        cfg.vf_coef,
                        cfg.normalize_advantage,
                    )
                else:
                    loss, stats = ppo_loss(
                        batch,
                        self.actor,
                        self.critic,
                        clip_range,
                        clip_range_vf,
                        cfg.ent_coef,
                        cfg.vf_coef,
                        cfg.normalize_advantage,
                        ema,
                        self.policy_config.critic_ema_coef,
                    )
                history.append(stats)
                if cfg.target_kl is not None and stats["approx_kl"].item() > 1.5 * cfg.target_kl:
                    continue_training = False
                    if self.verbose >= 1:
                        print_early_stop(epoch, stats["approx_kl"].item())
                    break
                if self._sb3_trainer is not None:
                    self._sb3_trainer.step(loss, cfg.max_grad_norm)
                else:
                    self._optimizer_step(loss, cfg.max_grad_norm)
            self._n_updates += 1
            if not continue_training:
                break
        self._record_train_means(sb3_train_log(history, last_epoch), clip_range, clip_range_vf)

    def _minibatches(self):
        """Minibatches of samples, or of whole sequences for a recurrent policy."""
        if self.recurrent is not None:
            return self.recurrent.minibatches(self.config.batch_size)
        return self.rollout_buffer.minibatches(self.config.batch_size)

    def _reset_env(self) -> None:
        super()._reset_env()
        if self.recurrent is not None:
            self.recurrent.reset_memories(self.actor, self.critic)

    def _record_train_means(self, means: dict[str, float], clip_range: float, clip_range_vf) -> None:
        """Log the minibatch statistics (reduced by :func:`sb3_train_log`) and the rollout's value diagnostics."""
        buffer = self.rollout_buffer
        for key, value in means.items():
            self.logger.record(f"train/{key}", value)
        self.logger.record(
            "train/explained_variance",
            float(explained_variance(buffer.values.flatten(), buffer.returns.flatten())),
        )
        values = buffer.values_tensor
        self.logger.record("train/value_mean", values.mean().item())
        if values.numel() > 1:  # a rollout of one sample has no spread
            self.logger.record("train/value_std", values.std().item())
        self.logger.record("train/td_error_abs", buffer.td_error_abs)
        if self._value_entropy is not None:
            self.logger.record("train/value_entropy", self._value_entropy)
        trainer = self._sb3_trainer
        log_std = getattr(self.actor.head, "log_std", None) if trainer is None else trainer.log_std()
        if log_std is not None:
            self.logger.record("train/std", log_std.detach().exp().mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)


def _permute(rollout: tuple[torch.Tensor, ...], perm: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every tensor of ``rollout`` reordered by ``perm`` (a tensor appearing twice is gathered once)."""
    done: dict[int, torch.Tensor] = {}
    for x in rollout:
        if id(x) not in done:
            done[id(x)] = x[perm]
    return tuple(done[id(x)] for x in rollout)


def _split(tensors: tuple[torch.Tensor, ...], size: int) -> list[tuple[torch.Tensor, ...]]:
    """Every tensor of ``tensors`` split into parts of ``size`` rows, views (a tensor appearing twice is split once)."""
    done: dict[int, tuple[torch.Tensor, ...]] = {}
    for x in tensors:
        if id(x) not in done:
            done[id(x)] = x.split(size)
    return [done[id(x)] for x in tensors]


class _Evaluated:
    """The steps of a rollout evaluated so far: raw critic outputs, values and old log-probs in step order, up
    to step ``end``, and the truncation bootstraps before step ``truncated_until``."""

    def __init__(self) -> None:
        self.raws: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.log_probs: list[torch.Tensor] = []
        self.end = 0
        self.truncated_until = 0


def warn_weights_changed_in_rollout(agent: str) -> None:
    warn_user(
        f"A callback changed the policy's weights between the steps of a rollout. {agent} computes a rollout's old "
        "log-probs and values after it, with the weights at its end, where SB3's PPO keeps each step's as it acted: "
        "change them in _on_rollout_start or _on_rollout_end."
    )


class WeightWatch:
    """The weights a rollout acts with (copies of the model's flat parameter buffers), to find a callback's change
    between steps and to put them back in place while the steps that acted with them are evaluated. Weights are
    compared as bytes: a few microseconds for PPO's default networks, and a NaN equals itself."""

    def __init__(self, flats: list) -> None:
        self.flats = flats
        self._data: list[torch.Tensor] = []
        self._arrays: list[np.ndarray | None] = []
        self.take_new_weights()

    def _bytes(self) -> list[bytes]:
        data = [flat.data for flat in self.flats]
        if len(data) != len(self._data) or any(a is not b for a, b in zip(data, self._data)):  # views of new ones
            self._data = data
            self._arrays = [x.detach().numpy() if x.device.type == "cpu" else None for x in data]
        return [x.detach().cpu().numpy().tobytes() if a is None else a.tobytes() for x, a in zip(data, self._arrays)]

    def changed(self) -> bool:
        return self._bytes() != self.saved

    def take_new_weights(self) -> None:
        self.weights = [flat.data.detach().clone() for flat in self.flats]
        self.saved = self._bytes()

    @contextlib.contextmanager
    def earlier_weights(self):
        """The weights before the change in place; after, the new ones back, and kept as those acting now."""
        new = [flat.data.detach().clone() for flat in self.flats]
        with torch.no_grad():
            for flat, weights in zip(self.flats, self.weights):
                flat.data.copy_(weights)
        try:
            yield
        finally:
            with torch.no_grad():
                for flat, weights in zip(self.flats, new):
                    flat.data.copy_(weights)
            self.take_new_weights()


def _slice(obs: ObsTensor, start: int, stop: int) -> ObsTensor:
    return {k: v[start:stop] for k, v in obs.items()} if isinstance(obs, dict) else obs[start:stop]


def _stack_obs(items: list[Any]) -> Any:
    if isinstance(items[0], dict):
        return {k: np.stack([it[k] for it in items]) for k in items[0]}
    return np.stack(items)


# SB3's abstract base takes covey's PPO as a virtual subclass: code that asks isinstance(model, OnPolicyAlgorithm)
# or BaseAlgorithm to choose how to drive a model (imitation's GAIL and AIRL count a round as n_steps * n_envs,
# its rollout helpers call predict) treats it as SB3's PPO. Nothing is inherited.
OnPolicyAlgorithm.register(PPO)

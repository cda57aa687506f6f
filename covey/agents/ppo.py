"""Proximal Policy Optimization (Schulman et al. 2017, https://arxiv.org/abs/1707.06347) with SB3's API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from stable_baselines3.common.utils import explained_variance

from covey.agents.base import BaseAgent, Schedule, as_schedule, require, warn_batch_size
from covey.agents.recurrent import RecurrentRollout
from covey.buffers.rollout import RolloutBatch, RolloutBuffer
from covey.networks.actor_critic import Actor, Critic, PolicyConfig, build_actor_critic, memory_settings
from covey.networks.ema import CriticEMA, ema_regularizer
from covey.networks.obs import ObsTensor, batch_to_tensor

# Observations per forward pass when values and log-probs are computed for a whole rollout.
_EVAL_CHUNK = 4096


@dataclass
class OnPolicyConfig:
    """Hyperparameters shared by the on-policy agents (PPO, POCA), named and defaulted as in SB3's PPO."""

    agent: ClassVar[str] = "PPO"

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
    stats_window_size: int = 100
    """Episodes averaged for rollout/ep_rew_mean and rollout/ep_len_mean."""

    def need(self, ok: bool, name: str, rule: str) -> None:
        require(ok, self.agent, name, getattr(self, name), rule)

    def __post_init__(self) -> None:
        need = self.need
        need(isinstance(self.n_steps, (int, np.integer)) and self.n_steps >= 1, "n_steps", "it must be an int >= 1")
        need(isinstance(self.batch_size, (int, np.integer)) and self.batch_size >= 1, "batch_size", "it must be >= 1")
        need(
            not (self.normalize_advantage and self.batch_size == 1),
            "batch_size",
            "it must be > 1 when normalize_advantage=True (a single advantage cannot be normalized)",
        )
        need(isinstance(self.n_epochs, (int, np.integer)) and self.n_epochs >= 1, "n_epochs", "it must be >= 1")
        need(0.0 <= self.gamma <= 1.0, "gamma", "it must lie in [0, 1]")
        need(0.0 <= self.gae_lambda <= 1.0, "gae_lambda", "it must lie in [0, 1]")
        need(callable(self.clip_range) or self.clip_range > 0, "clip_range", "it must be > 0 or a schedule")
        need(callable(self.learning_rate) or self.learning_rate >= 0, "learning_rate", "it must be >= 0 or a schedule")
        need(self.max_grad_norm > 0, "max_grad_norm", "it must be > 0")
        need(self.stats_window_size >= 1, "stats_window_size", "it must be >= 1")


@dataclass
class PPOConfig(OnPolicyConfig):
    """PPO's hyperparameters, named and defaulted as in Stable-Baselines3."""

    clip_range_vf: Schedule | None = None
    """Clipping of the value change around the old value (None: no value clipping)."""
    target_kl: float | None = None
    """Stop the epochs early when the approximate KL of a minibatch exceeds 1.5 * target_kl."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.need(
            self.clip_range_vf is None or callable(self.clip_range_vf) or self.clip_range_vf > 0,
            "clip_range_vf",
            "it must be None, > 0 or a schedule",
        )
        self.need(self.target_kl is None or self.target_kl > 0, "target_kl", "it must be None or > 0")


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
    log_prob, entropy = actor.evaluate(batch.observations, batch.actions)
    raw = critic.raw(batch.observations)
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
    head: torch.nn.Module,
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
    recurrent training): ``(loss, detached stats)``."""
    advantages = batch.advantages
    if normalize_advantage and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss, approx_kl, clip_fraction = clipped_surrogate_loss(log_prob, batch.old_log_prob, advantages, clip_range)
    if head.distributional:
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


class PPO(BaseAgent):
    """Proximal Policy Optimization with the Stable-Baselines3 interface.

    Constructor arguments, defaults, ``learn``/``predict``/``save``/``load``, callbacks and logger keys
    follow ``stable_baselines3.PPO``. Actor and critic are separate networks (``model.policy`` is the
    actor; ``model.critic`` the value network).

    >>> from covey import PPO
    >>> model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, seed=0).learn(128)
    >>> model.num_timesteps
    128
    """

    agent_name = "PPO"
    schedule_keys = ("learning_rate", "clip_range", "clip_range_vf")

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
        if use_sde:
            raise NotImplementedError(
                "use_sde=True (generalized state-dependent exploration) is not supported by covey."
            )
        if rollout_buffer_class is not None or rollout_buffer_kwargs:
            raise NotImplementedError("Custom rollout buffers are not supported; remove rollout_buffer_class/kwargs.")
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
        )
        self.policy_config = PolicyConfig.from_kwargs(policy_kwargs)
        super().__init__(
            policy, env, learning_rate, policy_kwargs, stats_window_size, tensorboard_log, verbose, device, seed
        )
        self._expose_config()
        self.clip_range = as_schedule(clip_range)
        self.clip_range_vf = as_schedule(clip_range_vf) if clip_range_vf is not None else None
        if _init_setup_model:
            self._setup_model()

    def _setup_model(self) -> None:
        self._require_spaces()
        cfg = self.config
        buffer_size = cfg.n_steps * self.n_envs
        if cfg.normalize_advantage and buffer_size <= 1:
            raise ValueError(
                f"n_steps * n_envs = {buffer_size}: advantage normalization needs at least 2 samples per rollout. "
                "Raise n_steps or set normalize_advantage=False."
            )
        if self.env is not None:
            warn_batch_size(cfg.batch_size, buffer_size)
        self.set_random_seed(self.seed)
        self.actor, self.critic = build_actor_critic(
            self.policy_name, self.observation_space, self.action_space, self.policy_config
        )
        self.actor.to(self.device)
        self.critic.to(self.device)
        self.policy = self.actor
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
        self.optimizer = self._make_optimizer(params, adam_eps=1e-5)  # SB3's PPO uses eps=1e-5
        self.rollout_buffer = RolloutBuffer(
            cfg.n_steps, self.n_envs, self.observation_space, self.action_space, self.device
        )
        memory = memory_settings(self.policy_name, pc)
        self.recurrent: RecurrentRollout | None = None
        if memory is not None:
            self.recurrent = RecurrentRollout(
                self.actor, self.critic, cfg.n_steps, self.n_envs, int(memory["sequence_length"])
            )

    def _networks(self) -> dict[str, torch.nn.Module]:
        networks = {"actor": self.actor, "critic": self.critic}
        if self.critic_ema is not None:
            networks["critic_ema"] = self.critic_ema.model
        return networks

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

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

    def collect_rollouts(self, callback) -> bool:
        """Fill the rollout buffer with ``n_steps`` steps of every env; False when a callback stops training."""
        buffer, actor, env = self.rollout_buffer, self.actor, self.env
        space = self.observation_space
        buffer.reset()
        actor.set_training_mode(False)
        callback.on_rollout_start()
        truncations: list[tuple[int, int, Any]] = []
        new_obs = self._last_obs
        for step in range(self.config.n_steps):
            obs_tensor = batch_to_tensor(self._last_obs, space, self.device)
            # Acting needs only the actor; values and log-probs come in one pass after the rollout.
            if self.recurrent is not None:
                action_tensor = self.recurrent.act(actor, obs_tensor, self._last_episode_starts, step)
            else:
                with torch.inference_mode():
                    action_tensor = actor.act(obs_tensor)
            actions = action_tensor.cpu().numpy()  # numpy in callbacks' locals, as in SB3
            clipped_actions = actor.to_env_actions(actions)
            new_obs, rewards, dones, infos = env.step(clipped_actions)
            self.num_timesteps += env.num_envs
            callback.update_locals(locals())
            if not callback.on_step():
                return False
            self._update_info_buffer(infos, dones)
            terminated = dones.copy()
            for i in np.flatnonzero(dones):
                final_obs = infos[i].get("terminal_observation")
                if infos[i].get("TimeLimit.truncated", False) and final_obs is not None:
                    # A time limit is not a terminal: bootstrap from V(true final observation).
                    terminated[i] = False
                    truncations.append((step, int(i), final_obs))
            buffer.add(obs_tensor, action_tensor, rewards, terminated, dones)
            self._last_obs = new_obs
            self._last_episode_starts = dones
        if buffer.has_nan_observations():
            raise ValueError(
                "The env returned NaN observations during this rollout. Find the source with "
                "stable_baselines3.common.vec_env.VecCheckNan(env, raise_exception=True)."
            )
        last_values = self._evaluate_rollout(new_obs, truncations)
        buffer.compute_returns(last_values, self.config.gamma, self.config.gae_lambda)
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    @torch.no_grad()
    def _evaluate_rollout(self, last_obs: Any, truncations: list[tuple[int, int, Any]]) -> np.ndarray:
        """Values and old log-probs of the whole rollout in batched passes (parameters are unchanged
        since acting); returns V(last observation) per env and fills the truncation bootstraps."""
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
        obs, actions = buffer.flat_observations(), buffer.flat_actions()
        n = actions.shape[0]
        head = self.critic.value_head
        values, log_probs, entropies = [], [], []
        for start in range(0, n, _EVAL_CHUNK):
            chunk = _slice(obs, start, start + _EVAL_CHUNK)
            raw = self.critic.raw(chunk)
            values.append(head.value(raw))
            if head.distributional:
                entropies.append(head.entropy(raw))
            log_probs.append(self.actor.evaluate(chunk, actions[start : start + _EVAL_CHUNK])[0])
        self._value_entropy = torch.cat(entropies).mean().item() if entropies else None
        buffer.values = torch.cat(values).reshape(buffer.n_steps, buffer.n_envs)
        buffer.log_probs = torch.cat(log_probs).reshape(buffer.n_steps, buffer.n_envs)
        if truncations:
            finals = _stack_obs([obs_i for _, _, obs_i in truncations])
            bootstrap = self.critic(batch_to_tensor(finals, self.observation_space, self.device)).cpu().numpy()
            for (step, env_idx, _), value in zip(truncations, bootstrap):
                buffer.truncation_values[step, env_idx] = value
        return self.critic(batch_to_tensor(last_obs, self.observation_space, self.device)).cpu().numpy()

    def train(self) -> None:
        """Several epochs of minibatch updates on the collected rollout."""
        cfg = self.config
        progress = self._current_progress_remaining
        lr = self._update_learning_rate()
        clip_range = self.clip_range(progress)
        clip_range_vf = self.clip_range_vf(progress) if self.clip_range_vf is not None else None
        self.actor.set_training_mode(True)
        self.critic.train(True)
        history: list[dict[str, torch.Tensor]] = []
        continue_training = True
        ema = self.critic_ema.model if self.critic_ema is not None else None
        for _ in range(cfg.n_epochs):
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
                        self.logger.info(f"Early stopping: approx_kl {stats['approx_kl'].item():.4f} > 1.5 * target_kl")
                    break
                self._optimizer_step(loss, cfg.max_grad_norm)
            self._n_updates += 1
            if not continue_training:
                break
        self._record_train_stats(history, lr, clip_range, clip_range_vf)

    def _minibatches(self):
        """Minibatches of samples, or of whole sequences for a recurrent policy."""
        if self.recurrent is not None:
            return self.recurrent.minibatches(self.config.batch_size)
        return self.rollout_buffer.minibatches(self.config.batch_size)

    def _reset_env(self) -> None:
        super()._reset_env()
        if self.recurrent is not None:
            self.recurrent.reset_memories(self.actor, self.critic)

    def _record_train_stats(self, history, lr: float, clip_range: float, clip_range_vf: float | None) -> None:
        buffer = self.rollout_buffer
        means = {k: torch.stack([h[k] for h in history]).mean().item() for k in history[0]} if history else {}
        for key, value in means.items():
            self.logger.record(f"train/{key}", value)
        self.logger.record(
            "train/explained_variance",
            float(explained_variance(buffer.values.flatten().cpu().numpy(), buffer.returns.flatten().cpu().numpy())),
        )
        values = buffer.values
        self.logger.record("train/value_mean", values.mean().item())
        self.logger.record("train/value_std", values.std().item())
        self.logger.record("train/td_error_abs", buffer.td_error_abs)
        if self._value_entropy is not None:
            self.logger.record("train/value_entropy", self._value_entropy)
        log_std = getattr(self.actor.head, "log_std", None)
        if log_std is not None:
            self.logger.record("train/std", log_std.detach().exp().mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)
        self.logger.record("train/learning_rate", lr)


def _slice(obs: ObsTensor, start: int, stop: int) -> ObsTensor:
    return {k: v[start:stop] for k, v in obs.items()} if isinstance(obs, dict) else obs[start:stop]


def _stack_obs(items: list[Any]) -> Any:
    if isinstance(items[0], dict):
        return {k: np.stack([it[k] for it in items]) for k in items[0]}
    return np.stack(items)

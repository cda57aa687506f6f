"""``model.policy``: SB3's policy interface over covey's separate actor and critic modules.

covey trains an :class:`~covey.networks.actor_critic.Actor` and a critic as two modules (``model.actor``,
``model.critic``). SB3 scripts reach both through ``model.policy``: they call it, ask it for values or a
distribution, save its ``state_dict``, or hand it to an exporter. :class:`ActorCriticPolicy` (PPO) and
:class:`SACPolicy` (SAC) hold those modules (no copies) and answer those calls with SB3's signatures and
shapes, computed by covey's own heads.

>>> import gymnasium as gym
>>> from covey.networks.actor_critic import build_actor_critic
>>> actor, critic = build_actor_critic("MlpPolicy", gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
>>> actions, values, log_prob = ActorCriticPolicy(actor, critic)(torch.zeros(5, 3))
>>> actions.shape, values.shape, log_prob.shape
(torch.Size([5]), torch.Size([5, 1]), torch.Size([5]))
"""

from __future__ import annotations

import copy
import os
import pickle
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common import policies as sb3_policies
from torch import nn

from covey.networks import sb3_names
from covey.networks.actor_critic import (
    PPO_ADAM_EPS,
    ParameterMismatchError,  # noqa: F401 (its name here before it moved)
    PolicyMethods,
    ReadOnlyViews,
    WarnsOnHook,
)
from covey.networks.distributions import ActionDistribution
from covey.networks.encoders import sb3_extractor
from covey.networks.obs import ObsTensor, check_obs_tensors
from covey.warning import warn_user


class _UncalledWhole(WarnsOnHook):
    """A module whose own ``forward`` covey never calls in acting or training, where SB3's PPO calls it at each
    step: registering a forward hook on it warns, naming ``_hooked_as`` and the layers to hook instead."""

    _hooked_as: str
    _layers_to_hook: str

    def _warn_unused_hook(self) -> None:
        name = self._hooked_as
        warn_user(
            f"A forward hook on {name} runs only where your code calls {name}(...) itself: covey acts and trains "
            f"through the actor's and the critic's layers, not through {name}'s forward as SB3's PPO does. Register "
            f"it on those layers ({self._layers_to_hook}), whose hooks run in acting and training."
        )


def _widths(trunk: nn.Module) -> list[int]:
    """The hidden layer sizes of an MLP trunk."""
    return [m.out_features for m in trunk if isinstance(m, nn.Linear)]


def _pickles(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:  # pickle raises AttributeError, TypeError or PicklingError for what it cannot take
        return False
    return True


class _PolicyBase(PolicyMethods, ReadOnlyViews, nn.Module):
    """What SB3's ``BasePolicy`` offers on every policy: predict, tensors, modes, ``save`` and ``load``, with
    :class:`~covey.networks.actor_critic.PolicyMethods` (action scaling, vectors)."""

    actor: nn.Module
    agent_name = ""
    """The agent whose model files :meth:`load` reads ("PPO" or "SAC")."""
    _model = None  # the agent this policy belongs to (what ``save`` writes), set by the agent
    config = None  # the agent's PolicyConfig (its policy_kwargs), set by the agent
    _adam_eps: float | None = None  # the eps the agent gives Adam when no optimizer_kwargs are given

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module``'s, which also takes the names of SB3's policy of this agent (``action_net.weight``, ...)
        and warns where ``strict=False`` loads nothing: no key of ``state_dict`` names a weight of this policy."""
        if self.agent_name in ("PPO", "SAC") and state_dict and sb3_names.is_sb3(self.agent_name, state_dict):
            state_dict = sb3_names.from_sb3(self.agent_name, state_dict)
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        if not strict and len(result.unexpected_keys) == len(state_dict):
            what = "is empty" if not state_dict else f"has none of its names (it has {sorted(state_dict)[:4]}...)"
            warn_user(
                f"load_state_dict(strict=False) changed no weight of this policy: the state dict {what}. covey's "
                f"policy names its weights as model.policy.state_dict() lists them ({next(iter(self.state_dict()))}, "
                "...), not as SB3's policy does, though it reads SB3's names where given: select the weights to "
                "change from model.policy.state_dict() by covey's names (actor.* for the actor)."
            )
        return result

    def __getstate__(self) -> dict:
        # Copies and pickles of a policy without a model hold its networks alone.
        state = dict(self.__dict__)
        state.pop("_model", None)
        return state

    def __reduce_ex__(self, protocol: int):
        # The policy of a model is copied with a copy of that model, without its env and buffers (as SB3's
        # policy copies hold no env): the copy predicts, trains and saves as the policy it was copied from.
        if self._model is None:
            return super().__reduce_ex__(protocol)
        from covey.agents.base import _policy_of_snapshot

        snapshot = self._model._snapshot(with_env=False)
        # SB3's policy holds no schedule, so pickle and torch.save take it whatever the model's learning rate is.
        # A schedule pickle cannot take (a nested function, as in SB3's docs) stays behind, for cloudpickle too
        # (which could take it; the pickler is not known here): the copy trains on at the value the model's file
        # keeps for it, as a loaded model does, and warns so at its first learn.
        snapshot["schedules"] = {k: f for k, f in snapshot["schedules"].items() if _pickles(f)}
        return _policy_of_snapshot, (type(self._model), snapshot)

    def __deepcopy__(self, memo: dict) -> _PolicyBase:
        if self._model is None:
            clone = type(self).__new__(type(self))
            memo[id(self)] = clone
            clone.__dict__.update(copy.deepcopy(self.__getstate__(), memo))
            return clone
        from covey.agents.base import _policy_of_snapshot

        clone = _policy_of_snapshot(type(self._model), copy.deepcopy(self._model._snapshot(with_env=False), memo))
        memo[id(self)] = clone
        return clone

    def save(self, path: str | os.PathLike) -> None:
        """SB3's ``policy.save``: the networks of the model this policy belongs to, written as a covey model
        file without optimizer states (atomically; ``.zip`` added to a path without a suffix), which
        :meth:`load` (or the agent's ``load``, to train on) reads back. Like SB3's, the file cannot resume
        training where it stopped: save the model for that."""
        model = self._model
        if model is None:
            raise RuntimeError(
                "This policy is a copy that no longer belongs to a model, so it cannot be saved on its own; "
                "save the model it came from (model.save(path) or model.policy.save(path))."
            )
        groups = model._parameter_groups()
        optimizers = [name for name, group in groups.items() if isinstance(group, torch.optim.Optimizer)]
        model.save(path, exclude=[*optimizers, "_last_obs"])  # a policy's file: no place in training either

    @classmethod
    def load(cls, path: str | os.PathLike, device: torch.device | str = "auto") -> _PolicyBase:
        """SB3's ``Policy.load``: the policy of a file written by :meth:`save` (or by the model's ``save``),
        ready to predict, e.g. in ``evaluate_policy``. Loading never runs code from the file."""
        from covey import serialization
        from covey.agents import agent_class

        agent = serialization.read_settings(path).get("agent")
        if agent != cls.agent_name:
            where = f"covey.{agent.lower()}.MlpPolicy.load" if agent in ("PPO", "SAC") else f"covey.{agent}.load"
            raise serialization.ModelFileError(
                f"The file holds a {agent} model, not a {cls.agent_name} one; load it with {where}."
            )
        model = agent_class(agent).load(path, device=device)
        return model.policy

    @property
    def observation_space(self) -> spaces.Space:
        return self.actor.observation_space

    @property
    def action_space(self) -> spaces.Space:
        return self.actor.action_space

    @property
    def device(self) -> torch.device:
        return self.actor.device

    @property
    def squash_output(self) -> bool:
        """Whether actions come squashed into [-1, 1] (SAC's Box actions, PPO's with ``squash_output``)."""
        return self.actor.squash_output

    def obs_to_tensor(self, observation) -> tuple[ObsTensor, bool]:
        return self.actor.obs_to_tensor(observation)

    # The settings SB3's policies keep (their policy_kwargs), read from the agent's configuration.
    def _setting(self, name: str):
        return getattr(self._config(name), name)

    def _config(self, name: str):
        if self.config is None:
            raise AttributeError(f"This policy has no record of its settings, so no {name!r}.")
        return self.config

    @property
    def net_arch(self) -> list[int] | dict[str, list[int]]:
        """``net_arch`` as given, or the hidden layer sizes covey built by default (as SB3 fills its default in)."""
        given = self._setting("net_arch")
        return given if given is not None else self._default_net_arch()

    def _default_net_arch(self) -> list[int] | dict[str, list[int]]:
        return _widths(self.actor.trunk)

    @property
    def activation_fn(self) -> type[nn.Module]:
        return self._setting("activation_fn")

    @property
    def normalize_images(self) -> bool:
        return self._setting("normalize_images")

    @property
    def optimizer_class(self) -> type[torch.optim.Optimizer]:
        return self._setting("optimizer_class")

    @property
    def optimizer_kwargs(self) -> dict:
        """The optimizer's keyword arguments: PPO's Adam gets ``eps=1e-5`` when none are given, as in SB3."""
        return self._config("optimizer_kwargs").optimizer_arguments(self._adam_eps)

    @property
    def features_extractor_class(self) -> type[nn.Module]:
        """The SB3 features extractor class given, else the class of covey's own encoder."""
        return self._setting("features_extractor_class") or type(self.actor.encoder)

    @property
    def features_extractor_kwargs(self) -> dict:
        return self._setting("features_extractor_kwargs")

    @property
    def use_sde(self) -> bool:
        return self._setting("use_sde")

    def predict(
        self,
        observation,
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """SB3's ``predict``: observations (numpy) to env actions (numpy), and the recurrent state. As SB3's, it
        puts the policy in evaluation mode first (dropout off, batch norm on its running statistics)."""
        if self.actor.training or self.critic.training:
            self.set_training_mode(False)
        return self.actor.predict(observation, state, episode_start, deterministic)

    def reset_noise(self, n_envs: int = 1) -> None:
        """SB3's ``reset_noise`` (``use_sde=True``): :meth:`Actor.reset_noise`."""
        self.actor.reset_noise(n_envs)

    @property
    def lstm_hidden_state_shape(self) -> tuple[int, int, int]:
        """sb3-contrib's: the shape of one env's memory state, ``(layers, 1, hidden size)``, from which scripts
        build a fresh state for ``predict`` (``np.zeros((layers, n_envs, hidden))``, one per state tensor)."""
        if self.actor.memory is None:  # not recurrent: no such attribute, as in SB3
            raise AttributeError("lstm_hidden_state_shape")
        return (1, 1, self.actor.memory.hidden_size)

    def _no_memory(self, method: str, memory: tuple = ()) -> None:
        """Refuses a call of the policy's ``method`` on a recurrent policy, and memory arguments (sb3-contrib's
        ``(obs, lstm_states, episode_starts)`` calls) on any policy, with the ways that work."""
        if self.actor.memory is not None:
            raise NotImplementedError(
                f"policy.{method} has no memory input (sb3-contrib's calls with lstm_states and episode_starts are "
                "not covey's); a recurrent policy acts with model.predict(obs, state=state, "
                "episode_start=episode_start), and covey.export.export_onnx(model, path) exports it with its state "
                "as graph inputs and outputs."
            )
        if memory:
            raise TypeError(
                f"policy.{method} got {len(memory)} arguments more than it takes: this policy has no recurrent memory, "
                "so it takes no lstm_states or episode_starts (sb3-contrib's calls)."
            )


class MlpExtractor(_UncalledWhole, nn.Module):
    """SB3's ``policy.mlp_extractor``: the actor's MLP trunk as ``policy_net`` and the critic's as ``value_net``,
    features to the latent features the action and value layers take (``latent_dim_pi``, ``latent_dim_vf``).

    A view over the policy's own modules, made on each access and not registered in the policy: its parameters
    and its ``state_dict()`` (``policy_net.0.weight``, ... as SB3 names them) are the policy's."""

    _hooked_as = "model.policy.mlp_extractor"
    _layers_to_hook = "mlp_extractor.policy_net and mlp_extractor.value_net"

    def __init__(self, policy_net: nn.Module, value_net: nn.Module) -> None:
        super().__init__()
        self.policy_net, self.value_net = policy_net, value_net
        self.latent_dim_pi, self.latent_dim_vf = policy_net.out_dim, value_net.out_dim
        self.training = policy_net.training  # the mode of the layers it views, as a registered module's follows

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: torch.Tensor) -> torch.Tensor:
        return self.policy_net(features)

    def forward_critic(self, features: torch.Tensor) -> torch.Tensor:
        return self.value_net(features)


class ActorCriticPolicy(_UncalledWhole, _PolicyBase):
    """PPO's ``model.policy``: SB3's ``ActorCriticPolicy`` calls over the actor and the critic.

    ``policy(obs)`` returns ``(actions, values, log_prob)``; ``evaluate_actions``, ``get_distribution``,
    ``predict_values`` and ``predict`` are SB3's. Both networks are submodules, so ``parameters()``,
    ``state_dict()``, ``to()`` and ``train()`` cover actor and critic together, as SB3's policy does.
    ``optimizer`` is the one optimizer that steps them.
    """

    agent_name = "PPO"
    _adam_eps = PPO_ADAM_EPS
    _hooked_as = "model.policy"
    _layers_to_hook = "model.policy.action_net, model.policy.mlp_extractor.policy_net[0], ..."

    def __init__(self, actor: nn.Module, critic: nn.Module, model=None) -> None:
        super().__init__()
        self.actor = actor
        self.critic = critic
        self._model = model

    def forward(
        self, obs: ObsTensor, deterministic: bool = False, *memory: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Actions (shaped as the action space, batched), values ``(B, 1)`` and log-probabilities ``(B,)``.
        (``memory``: sb3-contrib's ``policy(obs, lstm_states, episode_starts, deterministic)``, refused with the
        ways that work.)"""
        self._no_memory("forward", memory)
        dist = self.get_distribution(obs)
        actions = dist.head.sample(dist.params, deterministic)
        log_prob = dist.head.log_prob(dist.params, actions)
        return actions.reshape((-1, *self.action_space.shape)), self.predict_values(obs), log_prob

    def evaluate_actions(
        self, obs: ObsTensor, actions: torch.Tensor, *memory: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Values ``(B, 1)``, log-probabilities ``(B,)`` of ``actions`` and entropies ``(B,)``."""
        self._no_memory("evaluate_actions", memory)
        dist = self.get_distribution(obs)
        return self.predict_values(obs), dist.log_prob(actions), dist.entropy()

    def get_distribution(self, obs: ObsTensor, *memory: Any) -> ActionDistribution:
        """The action distribution for a batch of observation tensors."""
        self._no_memory("get_distribution", memory)
        return self.actor.get_distribution(obs)

    def _predict(self, observation: ObsTensor, deterministic: bool = False) -> torch.Tensor:
        """Actions for a batch of observation tensors (SB3's ``_predict``; Box actions not yet clipped)."""
        return self.get_distribution(observation).get_actions(deterministic)

    def predict_values(self, obs: ObsTensor, *memory: Any) -> torch.Tensor:
        """State values ``(B, 1)``."""
        check_obs_tensors(obs, self.observation_space)
        self._no_memory("predict_values", memory)
        return self.critic(obs).unsqueeze(-1)

    def set_training_mode(self, mode: bool) -> None:
        self.train(mode)

    # SB3's names for parts of its policy, where covey has the same part.
    @property
    def log_std(self) -> torch.nn.Parameter:
        """The state-independent log-std of a Gaussian policy; a policy of other actions has none, as in SB3
        (``hasattr(model.policy, "log_std")`` tells them apart)."""
        log_std = self.actor.log_std
        if log_std is None:  # then nn.Module's __getattr__ raises SB3's own AttributeError
            raise AttributeError("log_std")
        return log_std

    @property
    def features_extractor(self) -> nn.Module:
        """The actor's encoder: the user's SB3 extractor object where ``features_extractor_class`` was given."""
        return sb3_extractor(self.actor.encoder)

    @property
    def features_dim(self) -> int:
        """The actor's encoder's number of features (SB3's attribute, its ``pi_features_extractor``'s)."""
        return int(self.actor.encoder.out_dim)

    @property
    def pi_features_extractor(self) -> nn.Module:
        return sb3_extractor(self.actor.encoder)

    @property
    def vf_features_extractor(self) -> nn.Module:
        return sb3_extractor(self.critic.encoder)

    @property
    def share_features_extractor(self) -> bool:
        return self.actor.encoder is self.critic.encoder

    @property
    def ortho_init(self) -> bool:
        return self._setting("ortho_init")

    @property
    def log_std_init(self) -> float:
        return self._setting("log_std_init")

    def _default_net_arch(self) -> list[int] | dict[str, list[int]]:
        pi, vf = _widths(self.actor.trunk), _widths(self.critic.trunk)
        return dict(pi=pi, vf=vf) if pi or vf else []  # SB3's CnnPolicy default: no hidden layers, []

    @property
    def mlp_extractor(self) -> MlpExtractor:
        """The actor's and the critic's MLP trunks, as SB3's ``MlpExtractor`` (a view, see :class:`MlpExtractor`)."""
        return MlpExtractor(self.actor.trunk, self.critic.trunk)

    def extract_features(
        self, obs: ObsTensor, features_extractor: nn.Module | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """SB3's ``extract_features``: observation tensors through the given encoder, else the shared encoder's
        features, or a ``(pi_features, vf_features)`` pair with ``share_features_extractor=False``, as in SB3."""
        check_obs_tensors(obs)
        if features_extractor is not None:
            # the policy's own extractors get their inputs as the networks give them (SB3 preprocesses them too)
            encoder = next(
                (e for e in (self.actor.encoder, self.critic.encoder) if sb3_extractor(e) is features_extractor),
                features_extractor,
            )
            return encoder(obs)
        if self.share_features_extractor:
            return self.actor.encoder(obs)
        return self.actor.encoder(obs), self.critic.encoder(obs)

    @property
    def action_net(self) -> nn.Module:
        """The last layer: latent features to the distribution's parameters."""
        return self.actor.head.proj

    @property
    def value_net(self) -> nn.Module:
        """The last layer: latent features to the value (to the buckets' logits for a two-hot critic)."""
        return self.critic.value_head.proj


class SACPolicy(_PolicyBase):
    """SAC's ``model.policy``: SB3's ``SACPolicy`` over the actor, the critics and the target critics.

    ``policy(obs, deterministic)`` returns actions, squashed into [-1, 1] for Box action spaces (SB3's
    ``forward``; ``predict`` rescales them to the bounds). ``actor``, ``critic`` and ``critic_target`` are the
    model's own modules. ``optimizer`` is the actor's optimizer (the critics have ``model.critic.optimizer``).
    """

    agent_name = "SAC"

    def __init__(self, actor: nn.Module, critic: nn.Module, critic_target: nn.Module, model=None) -> None:
        super().__init__()
        self.actor = actor
        self.critic = critic
        self.critic_target = critic_target
        self._model = model

    @property
    def share_features_extractor(self) -> bool:
        return self._setting("share_features_extractor")

    def forward(self, obs: ObsTensor, deterministic: bool = False) -> torch.Tensor:
        check_obs_tensors(obs, self.observation_space)  # through the actor's call, which a forward hook on it sees
        return self.actor(obs, deterministic).reshape((-1, *self.action_space.shape))

    def _predict(self, observation: ObsTensor, deterministic: bool = False) -> torch.Tensor:
        """SB3's ``_predict``: :meth:`forward`."""
        return self(observation, deterministic)

    def set_training_mode(self, mode: bool) -> None:
        """Actor and critics (the target critics stay as they are, as in SB3)."""
        self.actor.train(mode)
        self.critic.train(mode)
        self.training = mode


# SB3's abstract policy classes take covey's as virtual subclasses, so that code which asks isinstance(policy,
# ActorCriticPolicy) or BasePolicy (imitation's BC, AIRL and rollout helpers) calls predict and evaluate_actions,
# which covey's policies have with SB3's signatures. SAC's policy is a BasePolicy only: SB3's SACPolicy promises its
# actor's distribution objects (get_action_dist_params, action_dist), which covey's actor does not make.
sb3_policies.ActorCriticPolicy.register(ActorCriticPolicy)
sb3_policies.BasePolicy.register(SACPolicy)

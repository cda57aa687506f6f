"""PPO and SAC with a user's own SB3 policy class: a subclass of SB3's ``ActorCriticPolicy`` (PPO: a custom
``mlp_extractor``, an overridden ``forward`` or ``evaluate_actions``, ...) or ``SACPolicy`` (SAC: custom actor or
critics), run through SB3's policy calls.

covey builds its own networks for SB3's policy names and SB3's own classes (``"MlpPolicy"``,
``ActorCriticPolicy``, ...). A class of the user's is code covey cannot rebuild as its networks, so the agent trains
it as SB3's does: the class builds the policy and its optimizers as SB3 builds them, PPO acts with ``policy(obs)``
and updates through ``policy.evaluate_actions``, SAC through the policy's ``actor``, ``critic`` and
``critic_target``, and ``model.policy`` is the SB3 policy itself. covey's buffers, losses, logging and files stay;
its hand-written gradients, NumPy acting and ONNX export, which need covey's networks, do not apply.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.sac.policies import SACPolicy

from covey.networks.obs import ObsTensor
from covey.spaces import check_finite_bounds, is_image_space

_OWN_PACKAGES = ("stable_baselines3", "sb3_contrib")
POLICY_BASES = {"PPO": ActorCriticPolicy, "SAC": SACPolicy}
"""The SB3 policy class whose subclasses each agent runs through SB3's calls."""


def sb3_policy_class(policy: Any, agent: str = "PPO") -> type | None:
    """``policy`` when it is a subclass of the SB3 policy class ``agent`` runs (:data:`POLICY_BASES`) defined
    outside SB3 and sb3-contrib (a user's class), else None (a policy name, or SB3's own class, which stands for
    covey's policy of its name)."""
    base = POLICY_BASES.get(agent)
    if base is None or not (isinstance(policy, type) and base in policy.__mro__):  # (covey's are virtual subclasses)
        return None
    if policy.__module__.split(".")[0] in _OWN_PACKAGES:
        return None
    if any(base.__module__.split(".")[0] == "sb3_contrib" for base in policy.__mro__):
        raise ValueError(
            f"{policy.__name__} subclasses an sb3-contrib policy ({', '.join(b.__name__ for b in policy.__mro__[1:3])}"
            f"), whose calls (recurrent states, action masks) covey's {agent} does not make. Subclass SB3's "
            f"{base.__name__}, or use a policy name: 'MlpLstmPolicy' gives covey's recurrent PPO."
        )
    return policy


def build_policy(
    policy_class: type,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    lr_schedule: Any,
    use_sde: bool,
    policy_kwargs: dict,
    device: torch.device | str,
) -> Any:
    """``policy_class(observation_space, action_space, lr_schedule, use_sde=..., **policy_kwargs)`` on ``device``,
    as SB3's algorithms build it; a keyword the class does not take gets the fix."""
    try:
        policy = policy_class(observation_space, action_space, lr_schedule, use_sde=use_sde, **policy_kwargs)
    except TypeError as err:
        if "unexpected keyword argument" not in str(err):  # a failure inside the class, not its arguments
            raise
        raise TypeError(
            f"{policy_class.__name__}(observation_space, action_space, lr_schedule, use_sde=..., "
            f"**policy_kwargs) failed: {err}. covey builds the policy class as SB3 does; pass only policy_kwargs "
            "that the class takes."
        ) from err
    return policy.to(device)


def optimizer_owners(policy: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The modules of an SB3 policy that hold an ``optimizer``, by path: ``""`` (the policy: PPO's), ``"actor"`` and
    ``"critic"`` (SAC's)."""
    owners = {"": policy, "actor": getattr(policy, "actor", None), "critic": getattr(policy, "critic", None)}
    return {
        path: owner
        for path, owner in owners.items()
        if isinstance(getattr(owner, "optimizer", None), torch.optim.Optimizer)
    }


def _discrete_keys(space: spaces.Space) -> bool | frozenset[str]:
    """True for a Discrete observation space, a Dict's Discrete keys, or False (none)."""
    if isinstance(space, spaces.Discrete):
        return True
    if isinstance(space, spaces.Dict):
        return frozenset(key for key, sub in space.spaces.items() if isinstance(sub, spaces.Discrete))
    return False


def class_path(cls: type) -> str:
    """``module.QualifiedName`` of a class: how the model file names it (it is never imported from there)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def wrap_env(venv: VecEnv, verbose: int) -> VecEnv:
    """SB3's own wrapping of an algorithm's VecEnv: channel-last images move to channels first
    (``VecTransposeImage``), which SB3's policies expect."""
    return BaseAlgorithm._wrap_env(venv, verbose)


def action_start(space: spaces.Space) -> np.ndarray | None:
    """A Discrete's or a MultiDiscrete's ``start`` (shaped as its actions), where it is not 0: where covey's
    actions are SB3's shifted. None for other spaces."""
    start = getattr(space, "start", None)
    if not isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)) or not np.any(start != 0):
        return None
    return np.asarray(start, dtype=np.int64)


def check_observation_starts(space: spaces.Space, policy_name: str) -> None:
    """Refuse Discrete and MultiDiscrete observations (a Dict's keys too) with a ``start`` for a user's SB3 policy
    class: SB3's preprocessing one-hots the values from 0 and fails mid-``learn`` on them."""
    for where, sub in _observation_parts(space):
        if isinstance(sub, (spaces.Discrete, spaces.MultiDiscrete)) and np.any(sub.start != 0):
            raise ValueError(
                f"{where} is {sub}, whose values start at {sub.start}: SB3's preprocessing, which {policy_name} "
                "runs, one-hots them from 0 and fails on them. Shift the observations to start at 0 in a "
                "wrapper of the env (gymnasium.wrappers.TransformObservation), or use a policy name "
                "('MlpPolicy'), whose encoder reads the space's start."
            )


def _observation_parts(space: spaces.Space) -> list[tuple[str, spaces.Space]]:
    """``space``'s parts, each with its name in words: a Dict's keys, or the space itself."""
    if isinstance(space, spaces.Dict):
        return [(f"Observation key {key!r}", sub) for key, sub in space.spaces.items()]
    return [("The observation space", space)]


def sb3_observation_problem(space: spaces.Space, policy_name: str) -> str | None:
    """Why SB3's policy ``policy_name`` (built by :meth:`~covey.agents.base.BaseAgent.to_sb3_model`) would not
    read observations of ``space`` as covey's networks of the same name read them, or None. SB3's preprocessing
    one-hots Discrete values from 0 and flattens a MultiDiscrete's nvec as one row; its MlpPolicy takes no Dict and
    its MultiInputPolicy nothing else."""
    wants_dict = policy_name.startswith("MultiInput")
    if isinstance(space, spaces.Dict) != wants_dict:
        if wants_dict:
            return f"SB3's {policy_name} takes Dict observations only, and these are {space}: train with 'MlpPolicy'"
        return (
            f"SB3's {policy_name} takes no Dict observations ({space}): train with 'MultiInputPolicy' (SB3's "
            "policy for them)"
        )
    for where, sub in _observation_parts(space):
        if isinstance(sub, (spaces.Discrete, spaces.MultiDiscrete)) and np.any(sub.start != 0):
            return (
                f"{where} is {sub}, whose values start at {sub.start}: SB3's preprocessing one-hots them from 0 "
                "(other inputs, or an error in its predict). Shift the observations to start at 0 in a wrapper of "
                "the env (gymnasium.wrappers.TransformObservation) and train on them"
            )
        if isinstance(sub, spaces.MultiDiscrete) and sub.nvec.ndim > 1:
            return (
                f"{where} is {sub}, of shape {sub.shape}: SB3's preprocessing takes a MultiDiscrete of one "
                "dimension. Flatten it in a wrapper of the env (a MultiDiscrete of nvec.flatten()) and train on that"
            )
        if is_image_space(sub) and int(np.argmin(sub.shape)) == 1:
            return (
                f"{where} is {sub}, an image whose smallest axis is the middle one: SB3 takes it for channels last "
                "and moves its axes (VecTransposeImage), covey's networks read it as it is. Give the env images "
                "with the channels first or last"
            )
        if isinstance(sub, spaces.Box) and (sub.shape == () or int(np.prod(sub.shape)) == 0):
            return (
                f"{where} is {sub}: SB3's networks take a Box of one or more numbers in one dimension or more. "
                "Give the env a Box of shape (1,) for one number (or leave out an empty one)"
            )
    return None


class SB3PolicyTrainer:
    """The calls PPO makes on a user's SB3 policy class, as SB3's PPO makes them.

    >>> import gymnasium as gym
    >>> from stable_baselines3.common.policies import ActorCriticPolicy
    >>> class MyPolicy(ActorCriticPolicy):
    ...     pass
    >>> env = gym.make("CartPole-v1")
    >>> policy = MyPolicy(env.observation_space, env.action_space, lambda _: 3e-4)
    >>> trainer = SB3PolicyTrainer(policy, env.observation_space, env.action_space)
    >>> actions, values, log_probs = trainer.act(torch.zeros(2, 4))
    >>> actions.shape, values.shape, log_probs.shape
    (torch.Size([2]), torch.Size([2]), torch.Size([2]))
    """

    def __init__(self, policy: ActorCriticPolicy, observation_space: spaces.Space, action_space: spaces.Space) -> None:
        self.policy, self.action_space = policy, action_space
        # SB3's rollout buffer stores a Discrete observation as one entry: the update hands them over as (B, 1)
        self.discrete_obs = _discrete_keys(observation_space)
        check_observation_starts(observation_space, type(policy).__name__)
        # SB3's policies act from 0 whatever a Discrete's start: covey's actions are theirs shifted by the start
        self.start = action_start(action_space)
        if policy.squash_output:
            check_finite_bounds(action_space, f"{type(policy).__name__} with squash_output=True")

    def act(self, obs: ObsTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(actions, values (N,), log-probs (N,))`` of a step's observations: ``policy(obs)``."""
        with torch.no_grad():
            actions, values, log_probs = self.policy(obs)
        return self.shifted(actions), values.flatten(), log_probs

    def shifted(self, actions: Any) -> Any:
        """The policy's actions (a tensor or an array) moved into the action space: shifted by a Discrete's or a
        MultiDiscrete's start."""
        if self.start is None:
            return actions
        return actions + (torch.as_tensor(self.start) if isinstance(actions, torch.Tensor) else self.start)

    def values(self, obs: ObsTensor) -> torch.Tensor:
        """V(obs) ``(N,)``: ``policy.predict_values``."""
        with torch.no_grad():
            return self.policy.predict_values(obs).flatten()

    def evaluate(self, obs: ObsTensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(values (N,), log-probs, entropies)`` of a minibatch with gradients: ``policy.evaluate_actions``. A
        policy without an entropy (None, as SB3 allows) gives minus the log-prob, as SB3's PPO estimates it."""
        if self.start is not None:  # the buffer keeps the actions the env took
            actions = actions - torch.as_tensor(self.start, dtype=actions.dtype)
        if isinstance(self.action_space, spaces.Discrete):
            actions = actions.long().flatten()  # as SB3's PPO hands them over
        if self.discrete_obs is True:
            obs = obs.reshape(-1, 1)
        elif self.discrete_obs:
            obs = {key: value.reshape(-1, 1) if key in self.discrete_obs else value for key, value in obs.items()}
        values, log_prob, entropy = self.policy.evaluate_actions(obs, actions)
        return values.flatten(), log_prob, -log_prob if entropy is None else entropy

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """The actions the env gets: Box actions unscaled from [-1, 1] by a squashing policy, else clipped to the
        bounds (the buffer keeps them unclipped), as SB3's PPO does."""
        space = self.action_space
        if not isinstance(space, spaces.Box):
            return actions
        if self.policy.squash_output:
            return self.policy.unscale_action(actions)
        return np.clip(actions, space.low, space.high)

    def step(self, loss: torch.Tensor, max_grad_norm: float) -> None:
        """One step of ``policy.optimizer`` (read at each step: a script may replace it, as in SB3), with the
        gradient norm clipped to ``max_grad_norm``."""
        optimizer = self.policy.optimizer
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), max_grad_norm)
        optimizer.step()

    def log_std(self) -> torch.Tensor | None:
        """The policy's ``log_std`` parameter (Gaussian actions), which SB3 logs as ``train/std``."""
        return getattr(self.policy, "log_std", None)

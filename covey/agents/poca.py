"""MA-POCA (Cohen et al. 2021, https://arxiv.org/abs/2111.05992): cooperative multi-agent PPO for a
PettingZoo group, with a centralized attention critic and posthumous credit for agents that leave early."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.utils import explained_variance

from covey.agents.base import BaseAgent, Schedule, scheduled, warn_batch_size, whole_number
from covey.agents.ppo import (
    OnPolicyConfig,
    WeightWatch,
    _Evaluated,
    clipped_surrogate_loss,
    print_early_stop,
    sb3_train_log,
    value_loss,
    warn_weights_changed_in_rollout,
)
from covey.agents.recurrent import GroupRecurrentRollout
from covey.buffers.finite import check_finite
from covey.buffers.group import GroupBatch, GroupRolloutBuffer
from covey.networks.actor_critic import (
    PPO_ADAM_EPS,
    SAC_ONLY_KWARGS,
    Actor,
    PolicyConfig,
    build_poca_networks,
    check_state,
    forward_hooks_in,
    memory_settings,
    policy_kwargs_dict,
    positive_int,
)
from covey.networks.attention import POCACritic
from covey.networks.ema import CriticEMA, ema_regularizer
from covey.networks.encoders import FlatDict, obs_dtype
from covey.spaces import match_image_axes, warn_unmasked_actions
from covey.wrappers.group_env import (
    GroupStep,
    GroupVecEnv,
    is_aec_env,
    is_env_maker,
    is_parallel_env,
    make_group_env,
)

_EVAL_CHUNK = 256
"""Group-steps per batched pass of the rollout evaluation (:meth:`POCA._evaluate_rollout`): the attention critic's
intermediates for 256 groups stay small enough to keep in the CPU's caches; a rollout of 1,024 on simple_spread
took 0.7x the time in passes of 256 as in one pass (``python -m benchmarks.fast_paths --groups poca``). A row's
outputs do not depend on the pass it is in (on simple_spread they were the same to the bit)."""
DEFAULT_ATTENTION_WIDTH = 128
"""The critic's entity embedding width (``policy_kwargs=dict(attention_width=...)``). On simple_spread 64 makes a
minibatch 0.68x as long as 128 (``python -m benchmarks.fast_paths``) with slightly lower returns (``python -m
benchmarks.poca_width``). Model files keep their width; files from before it was saved were built with 128,
which load restores."""


@dataclass
class POCAConfig(OnPolicyConfig):
    """MA-POCA's hyperparameters: PPO's names, with defaults for small cooperative PettingZoo envs."""

    agent: ClassVar[str] = "POCA"
    minibatch_advantages: ClassVar[bool] = False

    n_steps: int = 256
    """Steps collected per env copy per rollout (a step of one copy moves all its agents)."""
    batch_size: int = 256
    """Minibatch size in group-steps (each carries every agent slot of its copy)."""
    n_epochs: int = 3
    """Passes over the rollout per update."""
    normalize_advantage: bool = True
    """Normalize the advantages once over the update's present agent-steps (MA-POCA's rule), not per minibatch
    as PPO does (so a minibatch of one group-step is fine)."""
    ent_coef: float = 5e-3
    """Entropy bonus coefficient (beta)."""
    baseline_coef: float = 0.5
    """Weight of the baseline loss: loss = policy + vf_coef * (value + baseline_coef * baseline) - beta * H."""
    groupmate_rewards: bool = False
    """Add the groupmates' rewards of the step to each agent's reward (a team reward)."""


def _check_copies(env: Any, n_envs: int | None) -> None:
    """A GroupVecEnv is stepped with its own copies: an ``n_envs`` given beside it must be their number."""
    if isinstance(env, GroupVecEnv) and n_envs is not None and n_envs != env.n_envs:
        raise ValueError(
            f"n_envs={n_envs}, but the env given is a {type(env).__name__} of {env.n_envs} copies, which POCA "
            f"steps as they are. Leave n_envs out (the env's copies count), or build the env with {n_envs} copies."
        )


class POCA(BaseAgent):
    """MA-POCA for a cooperative group of agents in a PettingZoo parallel env, with SB3's API.

    The env may be a ParallelEnv instance (one copy), a function returning one (``n_envs`` copies, default 1),
    an AEC env (converted), or a :class:`~covey.wrappers.group_env.GroupVecEnv` (its copies; an ``n_envs``
    given beside it must match). All agents share one policy (``model.policy``); ``model.critic`` is the
    attention critic. ``total_timesteps`` counts env steps of all copies (one parallel step of one copy = 1);
    agent-steps are logged beside it (``time/agent_steps``).

    The arguments are SB3 PPO's, in its order (defaults for small cooperative teams; each is described in
    :class:`POCAConfig`), then POCA's own, after ``device``:

    - ``n_envs``: env copies made from a function or class ``env`` (default 1).
    - ``baseline_coef``: weight of the counterfactual baseline's loss beside the value loss (0.5):
      ``policy + vf_coef * (value + baseline_coef * baseline) - ent_coef * entropy``.
    - ``groupmate_rewards``: add the groupmates' rewards of each step to every agent's (a team reward; False).

    >>> from covey import POCA
    >>> from covey.envs import EarlyExitEnv
    >>> model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=0).learn(32)
    >>> sorted(model.predict(EarlyExitEnv().reset(seed=0)[0], deterministic=True)[0])
    ['agent_0', 'agent_1', 'agent_2']
    """

    agent_name = "POCA"
    schedule_keys = ("learning_rate", "clip_range")
    config_class = POCAConfig
    own_attributes = frozenset({"clip_range"})
    built_from = {"n_steps": "the rollout buffer"}

    def __init__(
        self,
        policy: str,
        env: Any,
        learning_rate: Schedule = 3e-4,
        n_steps: int = 256,
        batch_size: int = 256,
        n_epochs: int = 3,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        clip_range: Schedule = 0.2,
        clip_range_vf: Schedule | None = None,
        normalize_advantage: bool = True,
        ent_coef: float = 5e-3,
        vf_coef: float = 0.5,
        max_grad_norm: float = 0.5,
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        rollout_buffer_class: Any = None,
        rollout_buffer_kwargs: dict | None = None,
        target_kl: float | None = None,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: torch.device | str = "auto",
        n_envs: int | None = None,
        baseline_coef: float = 0.5,
        groupmate_rewards: bool = False,
        _init_setup_model: bool = True,
    ) -> None:
        self.config = POCAConfig(
            learning_rate=learning_rate,
            n_steps=n_steps,
            batch_size=batch_size,
            n_epochs=n_epochs,
            gamma=gamma,
            gae_lambda=gae_lambda,
            clip_range=clip_range,
            normalize_advantage=normalize_advantage,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            baseline_coef=baseline_coef,
            max_grad_norm=max_grad_norm,
            groupmate_rewards=groupmate_rewards,
            target_kl=target_kl,
            stats_window_size=stats_window_size,
        )
        refuse_ppo_only_settings(clip_range_vf, use_sde, sde_sample_freq, rollout_buffer_class, rollout_buffer_kwargs)
        kwargs = policy_kwargs_dict(policy_kwargs)
        self.attention_width = kwargs.pop("attention_width", DEFAULT_ATTENTION_WIDTH)
        self.attention_heads = kwargs.pop("attention_heads", 4)
        for key in ("attention_width", "attention_heads"):
            value = getattr(self, key)
            if whole_number(value):  # a whole float, as a YAML file writes it, is the int (set below)
                value = int(value)
            if not positive_int(value):
                raise ValueError(f"policy_kwargs {key}={value!r} is invalid: it must be an int >= 1.")
        self.attention_width, self.attention_heads = int(self.attention_width), int(self.attention_heads)
        if self.attention_width % self.attention_heads:
            raise ValueError(
                f"policy_kwargs attention_width={self.attention_width} must be a multiple of attention_heads="
                f"{self.attention_heads} (each head takes an equal share of the width)."
            )
        if kwargs.pop("use_sde", False):
            raise ValueError(
                "policy_kwargs use_sde=True: POCA has no state-dependent exploration (its Box actions are Gaussian, "
                "clipped to the bounds). Remove use_sde."
            )
        self.policy_config = PolicyConfig.from_kwargs(kwargs, refused=SAC_ONLY_KWARGS, activation_fn=torch.nn.ReLU)
        if self.policy_config.squash_output:
            raise ValueError(
                "policy_kwargs squash_output=True applies to PPO with use_sde=True; POCA has no state-dependent "
                "exploration (its Box actions are clipped to the bounds): remove squash_output."
            )
        if whole_number(n_envs):
            n_envs = int(n_envs)
        if n_envs is not None and not positive_int(n_envs):
            raise ValueError(
                f"n_envs={n_envs!r} is invalid: it must be an int >= 1 (the env copies), or None for one copy of an "
                "env function or the copies of a GroupVecEnv."
            )
        _check_copies(env, n_envs)
        self._requested_n_envs = n_envs
        super().__init__(
            policy, env, learning_rate, policy_kwargs, stats_window_size, tensorboard_log, verbose, device, seed
        )
        self.agent_ids: list[str] = list(self.env.agent_ids) if self.env is not None else []
        self.agent_steps = 0
        if self.env is not None:  # in the constructor, as PPO's: not again in load(path, env=...)
            self._warn_batch_layout()
        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------ env plumbing (groups, not VecEnvs)
    def _warn_batch_layout(self) -> None:
        if memory_settings(self.policy_name, self.policy_config) is None:  # minibatches of group-steps, as PPO's
            warn_batch_size(self.config.batch_size, self.config.n_steps * self.n_envs)

    def _wrap_env(self, env: Any) -> GroupVecEnv:
        return make_group_env(env, getattr(self, "_requested_n_envs", None))

    def _attach_env(self, env: GroupVecEnv) -> None:
        known = getattr(self, "agent_ids", None)
        if known and list(env.agent_ids) != known:
            raise ValueError(
                f"The env's agents {list(env.agent_ids)} are not this model's group {known}; "
                + (
                    "the same agents in another order: list possible_agents in a fixed order (e.g. sorted; a set's "
                    "order changes with each process's string hashes)."
                    if sorted(map(repr, env.agent_ids)) == sorted(map(repr, known))
                    else "use an env with the same possible_agents."
                )
            )
        warn_unmasked_actions(env.observation_space)
        self.env = env
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self.n_envs = env.n_envs
        self.agent_ids = list(env.agent_ids)

    def _reset_env(self) -> None:
        self._last_obs, self._last_mask = self.env.reset()
        self._last_episode_starts = np.ones(self.env.n_envs, dtype=bool)
        # Where an agent's trajectory starts (recurrent actors reset their memory there).
        self._last_slot_starts = np.ones(self._last_mask.shape, dtype=bool)
        if getattr(self, "recurrent", None) is not None:
            self.recurrent.reset_memories(self.actor, self.critic)

    def _hyperparameters(self) -> dict[str, Any]:
        params = super()._hyperparameters()
        params["n_envs"] = self.n_envs
        return params

    def _env_place(self) -> None:
        """None: going on from where training left its group env takes more than its last observations, so a
        loaded POCA model starts with a reset."""
        return None

    def _extra_settings(self, excluded: frozenset[str] = frozenset()) -> dict[str, Any]:
        # predict() maps agent ids to slots; agent_steps keeps counting across save/load; the critic's shape.
        return {
            "agent_ids": list(self.agent_ids),
            "agent_steps": self.agent_steps,
            "attention_width": self.attention_width,
            "attention_heads": self.attention_heads,
        }

    def _restore_settings(self, settings: dict[str, Any]) -> None:
        # JSON keeps a tuple id (PettingZoo allows any hashable) as a list, which no id can be
        self.agent_ids = [_hashable(agent) for agent in settings.get("agent_ids", [])]
        self.agent_steps = int(settings.get("agent_steps", 0))
        # Files from before the width was saved: the width given in policy_kwargs, else 128 (the default then).
        self.attention_width = int(settings.get("attention_width", self.policy_kwargs.get("attention_width", 128)))
        self.attention_heads = int(settings.get("attention_heads", self.attention_heads))

    # ------------------------------------------------------------------ model
    def _require_spaces(self) -> None:
        if self.observation_space is None or self.action_space is None:
            raise ValueError(
                "POCA needs a PettingZoo env to build its networks: pass env=... (a ParallelEnv or AEC env, or a "
                "function returning one, e.g. simple_spread_v3.parallel_env), or use load() to restore a saved "
                "model without one."
            )

    @classmethod
    def _load_defaults(cls, env: Any, given: dict[str, Any]) -> dict[str, Any]:
        """``load`` with an env instance makes one copy (``n_envs=1``), whatever the file's count, as an SB3 model
        takes the number of envs of the env it is loaded with; an ``n_envs`` given beside a GroupVecEnv must match
        its copies, as in the constructor."""
        _check_copies(env, given.get("n_envs"))
        if env is not None and not isinstance(env, GroupVecEnv) and not is_env_maker(env):
            return {"n_envs": 1}
        return {}

    def get_sb3_parameters(self) -> dict[str, dict]:
        """Not for POCA: SB3 has no POCA to take its weights (PPO and SAC have this method)."""
        return super().get_sb3_parameters()

    def to_sb3_model(self, env: Any = None) -> Any:
        """Not for POCA: SB3 has no POCA (PPO and SAC have this method)."""
        return super().to_sb3_model(env)

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        """As SB3's: the env must have the model's number of copies, which its buffers are built for. A function
        (or class) making the env is called once per copy; an env instance is one copy."""
        if is_env_maker(env):
            env = make_group_env(env, self.n_envs)
        elif self.n_envs != 1 and (is_parallel_env(env) or is_aec_env(env)):
            raise ValueError(
                f"set_env() got one env instance, which is one copy, but this model steps {self.n_envs} env copies "
                f"(its buffers are built for them). Pass a function that makes the env (set_env(lambda: ...) makes "
                f"{self.n_envs} copies) or a GroupVecEnv of {self.n_envs} copies; to go on with one copy, save the "
                "model and load it with this env: POCA.load(path, env=env)."
            )
        super().set_env(env, force_reset)

    def _cpu_only(self) -> str | None:
        return "POCA keeps its group rollouts (and memories) on the CPU"

    def _setup_model(self) -> None:
        self._require_spaces()
        cfg = self.config
        # Agents observing a Dict space: each slot's observation is stored and acted on flat (FlatDict)
        dict_obs = isinstance(self.observation_space, spaces.Dict)
        self._flat_dict = FlatDict(self.observation_space) if dict_obs else None
        self._stored_space = self._flat_dict.flat_space if dict_obs else self.observation_space
        self.set_random_seed(self.seed)
        self.actor, self.critic = build_poca_networks(
            self.policy_name,
            self.observation_space,
            self.action_space,
            self.policy_config,
            self.attention_width,
            self.attention_heads,
        )
        self.actor.to(self.device)
        self.critic.to(self.device)
        self.policy = self.actor
        pc = self.policy_config
        self.critic_ema = CriticEMA(self.critic, pc.critic_ema_decay) if pc.critic_ema_decay is not None else None
        self._params = [*self.actor.parameters(), *self.critic.parameters()]
        # model.policy.optimizer as in SB3 (one optimizer steps the actor and the critic)
        self.optimizer = self.actor.optimizer = self._make_optimizer(self._params, adam_eps=PPO_ADAM_EPS)
        n_slots = len(self.agent_ids) if self.agent_ids else 1
        self.rollout_buffer = GroupRolloutBuffer(
            cfg.n_steps, self.n_envs, n_slots, self._stored_space, self.action_space
        )
        memory = memory_settings(self.policy_name, pc)
        self.recurrent = None
        if memory is not None:
            self.recurrent = GroupRecurrentRollout(
                self.actor, self.critic, cfg.n_steps, self.n_envs, n_slots, int(memory["sequence_length"])
            )

    def _rollout_observations(self) -> Any:
        buffer = self.rollout_buffer
        return buffer.observations_tensor[buffer.present_tensor]  # the agents that acted (K, *obs_shape)

    def _networks(self) -> dict[str, torch.nn.Module]:
        networks = {"actor": self.actor, "critic": self.critic}
        if self.critic_ema is not None:
            networks["critic_ema"] = self.critic_ema.model
        return networks

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    def _optimizer_slots(self) -> list[tuple[str, Any, Any]]:
        return [("policy.optimizer", self.policy.optimizer, self.optimizer)]

    # ------------------------------------------------------------------ acting
    @staticmethod
    def _group_starts(episode_start: Any, groups: tuple[int, int]) -> np.ndarray:
        """``predict``'s ``episode_start`` for the array form ``(n_envs, n_slots, ...)``, one bool per row of the
        flattened ``n_envs * n_slots``: from one bool, one per copy ``(n_envs,)``, one per slot ``(n_envs,
        n_slots)`` or one per row ``(n_envs * n_slots,)``."""
        n_envs, n_slots = groups
        starts = np.asarray(episode_start)
        if starts.shape == (n_envs * n_slots,):
            return starts.astype(bool)
        if starts.shape not in ((), (n_envs,), (n_envs, 1), (n_envs, n_slots)):
            raise ValueError(
                f"predict() got episode_start of shape {starts.shape} for observations of {n_envs} env copies of "
                f"{n_slots} slots: pass one bool, one per copy ({n_envs},), one per slot ({n_envs}, {n_slots}) or "
                f"one per row ({n_envs * n_slots},)."
            )
        per_copy = starts.reshape(-1, 1) if starts.ndim == 1 else starts
        return np.array(np.broadcast_to(per_copy.astype(bool), groups)).reshape(-1)

    def predict(self, observation: Any, state=None, episode_start=None, deterministic: bool = False):
        """``{agent: observation}`` -> ``({agent: action}, state)`` for the agents given (a subset is fine).

        An array ``(n_slots, *obs_shape)`` or ``(n_envs, n_slots, *obs_shape)`` gives actions for every slot.
        A recurrent policy (``"MlpLstmPolicy"`` or ``policy_kwargs=dict(memory=...)``) takes and returns
        SB3-contrib's ``state``: one memory row per slot of the group (``(1, n_slots, hidden)`` arrays, in
        ``model.agent_ids`` order; ``(1, n_envs * n_slots, hidden)`` for the 3-D array form; None: fresh).
        ``episode_start`` resets memories first: a bool for all, ``{agent: bool}`` (e.g. an agent that just
        joined), or an array over the given observations' rows. Others pass ``state`` through.
        """
        single = tuple(self._stored_space.shape)
        if isinstance(observation, tuple) and len(observation) == 2 and isinstance(observation[0], dict):
            raise ValueError(
                "predict() got a tuple of two dicts: PettingZoo's reset() returns (observations, infos). Pass the "
                "observations: obs, infos = env.reset(); actions, _ = model.predict(obs)."
            )
        if isinstance(observation, GroupStep):
            raise ValueError(
                "predict() got a GroupStep, what the group env's step() returns: pass its observations, "
                "actions, _ = model.predict(step.observations)."
            )
        if (
            isinstance(observation, tuple)
            and len(observation) == 2
            and isinstance(observation[1], np.ndarray)
            and observation[1].dtype == bool
            and observation[1].shape == np.shape(observation[0])[:2]
        ):
            raise ValueError(
                "predict() got a tuple of (observations, mask), what the group env's reset() returns: pass the "
                "observations, obs, mask = env.reset(); actions, _ = model.predict(obs)."
            )
        if not isinstance(observation, dict):
            obs = match_image_axes(np.asarray(observation), self._stored_space)  # HWC for CHW (or back), as PPO's
            if obs.dtype == object and any(isinstance(x, dict) for x in obs.reshape(-1)):
                raise ValueError(
                    f"predict() got a {type(observation).__name__} of dicts; it takes one {{agent: observation}} "
                    "dict (one env copy's group), or for several copies an array (n_envs, n_slots, *obs_shape) "
                    f"with slots in model.agent_ids order ({self.agent_ids})."
                )
            if obs.ndim == len(single) + 2:  # (n_envs, n_slots, *obs_shape): flatten the two group axes
                if obs.shape[2:] != single:
                    stored = "" if self._stored_space == self.observation_space else f", kept as rows of shape {single}"
                    dims = ", ".join(map(str, single))
                    raise ValueError(
                        f"predict() got an array of shape {obs.shape}, read as (n_envs, n_slots, *obs_shape): its "
                        f"observations have shape {obs.shape[2:]}, but this model's agents observe "
                        f"{self.observation_space}{stored}. Pass (n_envs, n_slots, {dims}) with slots in "
                        "model.agent_ids order, or an {agent: observation} dict."
                    )
                starts = None if episode_start is None else self._group_starts(episode_start, obs.shape[:2])
                actions, state = self.policy.predict(obs.reshape(-1, *single), state, starts, deterministic)
                return actions.reshape(*obs.shape[:2], *actions.shape[1:]), state
            return self.policy.predict(obs, state, episode_start, deterministic)
        unknown = [a for a in observation if a not in self.agent_ids]
        if (
            unknown
            and isinstance(self.observation_space, spaces.Dict)
            and set(observation) == set(self.observation_space)
        ):
            raise ValueError(
                f"predict() got one agent's Dict observation (keys {list(observation)}); pass the group's "
                "observations as {agent: observation}, as PettingZoo's reset() and step() return them."
            )
        if unknown:
            raise ValueError(
                f"predict() got observations for agents {unknown} that are not in this model's group "
                f"{self.agent_ids}. Pass a dict of the group's agent ids to observations."
            )
        if not observation:
            return {}, state
        agents = list(observation)
        if self._flat_dict is not None:  # flat, as the networks take them
            observation = {a: self._flat_dict.flatten(observation[a], repr(a), any_layout=True) for a in agents}
        else:
            observation = {a: match_image_axes(np.asarray(observation[a]), self._stored_space) for a in agents}
        wrong = {a: np.shape(observation[a]) for a in agents if np.shape(observation[a]) != single}
        if wrong and all(shape[1:] == single for shape in wrong.values()):  # a batch under each agent's key
            raise ValueError(
                "predict() got a batch of observations under an agent's key: "
                + ", ".join(f"{a!r} {shape}" for a, shape in wrong.items())
                + f". An {{agent: observation}} dict holds one observation of shape {single} per agent (one env "
                "copy's group); for several copies at once pass an array (n_envs, n_slots, "
                f"{', '.join(map(str, single))}) with slots in model.agent_ids order ({self.agent_ids})."
            )
        if wrong:
            raise ValueError(
                "predict() got observations of the wrong shape: "
                + ", ".join(f"{a!r} {shape}" for a, shape in wrong.items())
                + f"; this model's agents observe {self.observation_space}, shape {single}. Check that the env "
                "matches the one the model was trained on."
            )
        batch = np.stack([np.asarray(observation[a]) for a in agents])
        if self.actor.memory is None:
            actions, _ = self.policy.predict(batch, None, None, deterministic)
            return {a: actions[i] for i, a in enumerate(agents)}, state
        # Recurrent: each agent reads and advances its own slot's memory; the other slots keep theirs.
        memory, n_slots = self.actor.memory, len(self.agent_ids)
        if state is None:
            state = tuple(np.zeros((1, n_slots, memory.hidden_size), np.float32) for _ in range(memory.n_state))
        check_state(state, memory, n_slots)
        slots = [self.agent_ids.index(a) for a in agents]
        if isinstance(episode_start, dict):
            strangers = [a for a in episode_start if a not in self.agent_ids]
            if strangers:
                raise ValueError(
                    f"predict() got episode_start for agents {strangers} that are not in this model's group "
                    f"{self.agent_ids}."
                )
            starts = np.array([bool(episode_start.get(a, False)) for a in agents])
        else:
            starts = np.asarray(False if episode_start is None else episode_start, dtype=bool)
            if starts.shape not in ((), (len(agents),)):
                raise ValueError(
                    f"episode_start must be a bool, {{agent: bool}}, or one bool per observation given "
                    f"(shape ({len(agents)},), for {agents}), got shape {starts.shape}."
                )
            starts = np.array(np.broadcast_to(starts, (len(agents),)))
        own = tuple(np.asarray(s)[:, slots] for s in state)
        actions, own = self.policy.predict(batch, own, starts, deterministic)
        state = tuple(np.array(s, dtype=np.float32) for s in state)
        for full, new in zip(state, own):
            full[:, slots] = new
        return {a: actions[i] for i, a in enumerate(agents)}, state

    # ------------------------------------------------------------------ training loop
    def learn(
        self,
        total_timesteps: int,
        callback: Any = None,
        log_interval: int = 1,
        tb_log_name: str = "POCA",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> POCA:
        """Collect group rollouts and update until ``total_timesteps`` env steps (all copies); returns self."""
        return self._learn_on_policy(
            total_timesteps, callback, log_interval, tb_log_name, reset_num_timesteps, progress_bar
        )

    def _reset_own_counts(self) -> None:
        self.agent_steps = 0  # with num_timesteps, once learn's checks passed (a failed learn changes no count)

    def collect_rollouts(self, env: GroupVecEnv, callback: Any, rollout_buffer: Any, n_rollout_steps: int) -> bool:
        """Fill the group buffer with ``n_rollout_steps`` steps of every copy (the model's env, buffer and
        ``n_steps``, SB3's signature); False when a callback stops training."""
        # Callbacks read these locals by SB3's names: rollout_buffer, n_steps (the step), new_obs and rewards
        # (n_envs, n_slots, ...), actions (n_envs, n_slots, ...) as the policy drew them, clipped_actions as the
        # env took them, dones and infos (one per copy).
        self._check_collection(env, rollout_buffer, "rollout_buffer", n_rollout_steps)
        actor = self.actor
        rollout_buffer.reset()
        actor.set_training_mode(False)  # both networks act and value the rollout in evaluation mode
        self.critic.train(False)
        callback.on_rollout_start()
        self._relink_parameters()  # a callback's vector_to_parameters or p.data = ... acts from this step
        self._restart_unsettled(env)
        # Only a callback plays the env behind training's back or changes the weights between steps: with none,
        # no check per step. Values, baselines and old log-probs come after the rollout; where a callback
        # changes the weights between steps (an exploration schedule on log_std, vector_to_parameters), the steps
        # before the change are evaluated with the weights they acted with first, as PPO's are.
        user_code = self._runs_user_code(callback)
        restart = self._restart_unsettled if user_code else None
        take_back = self._take_back_replaced_parameters if user_code else None
        watch = WeightWatch(self._flat_parameters()) if user_code else None
        earlier = _GroupEvaluated(rollout_buffer.n_steps * rollout_buffer.n_envs)
        n_envs, n_slots = env.n_envs, env.n_slots
        dtype = obs_dtype(self._stored_space)
        # a forward hook keeps ordinary tensors, as in SB3 (looked for once a rollout)
        hooked = forward_hooks_in(actor)
        mode, act = (torch.no_grad, actor) if hooked else (torch.inference_mode, actor.act)  # the actor's own hook runs
        for n_steps in range(self.config.n_steps):
            obs = torch.as_tensor(self._last_obs, dtype=dtype)  # (E, S, *obs_shape)
            flat_obs = obs.reshape(n_envs * n_slots, *obs.shape[2:])  # all slots at once
            if self.recurrent is not None:
                action_tensor = self.recurrent.act(
                    actor, flat_obs, self._last_episode_starts, self._last_slot_starts, n_steps
                )
            else:
                with mode():
                    action_tensor = act(flat_obs)
            actions = action_tensor.cpu().numpy().reshape(n_envs, n_slots, *self.action_space.shape)
            clipped_actions = actor.to_env_actions(actions).reshape(actions.shape)
            present = self._last_mask
            stopped = True
            try:
                step = env.step(clipped_actions)
                new_obs = step.observations
                self.num_timesteps += n_envs
                self.agent_steps += int(present.sum())
                rewards = step.rewards
                if self.config.groupmate_rewards:
                    rewards = np.where(present, rewards.sum(axis=1, keepdims=True), 0.0).astype(np.float32)
                dones = step.env_done
                infos = step.infos
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
            if restart is not None:
                restart(env, step, present)
            self._update_info_buffer(infos, dones)
            # The state after the step that the leavers' bootstrap uses: leavers' final observations plus
            # the agents still there (none of the new episode's when the copy was reset).
            staying = step.mask & ~dones[:, None]
            continuing_present = staying | step.left
            continuing_obs = np.where(
                step.left.reshape(*step.left.shape, *([1] * (step.observations.ndim - 2))),
                step.final_observations,
                step.observations,
            )
            # Only a copy whose every acting agent terminated is a true terminal of the group.
            group_terminal = dones & ~np.any(step.truncated & present, axis=1)
            rollout_buffer.add(
                obs,
                action_tensor,
                present,
                rewards,
                step.left,
                group_terminal,
                continuing_obs,
                continuing_present,
            )
            # A slot's trajectory goes on only where its agent acted in this step of the same episode: an agent
            # that joins (or comes back after leaving) starts with a fresh memory.
            self._last_slot_starts = ~present | dones[:, None]
            self._last_obs, self._last_mask, self._last_episode_starts = step.observations, step.mask, dones
            if changed and self.recurrent is not None:
                watch.take_new_weights()
                warn_weights_changed_in_rollout("A recurrent POCA")
            elif changed:  # steps up to this one acted with the weights before the callback's change
                with watch.earlier_weights():  # (this step's continuing states are valued after its callbacks)
                    self._evaluate_steps(earlier, n_steps + 1, n_steps)
        check_finite(
            "in this rollout",
            "Fix the env, or replace those values in a wrapper of it (pettingzoo.utils.BaseParallelWrapper).",
            # every array here leads with (step, copy, slot)
            lambda index: (
                f"first at step {index[0]} of the rollout, env copy {index[1]}, agent {self.agent_ids[index[2]]!r}"
            ),
            # continuing_obs: the observations after each step, leavers' final ones included
            observations=(rollout_buffer.observations_tensor, rollout_buffer.continuing_obs),
            rewards=rollout_buffer.rewards,
        )
        last_values = self._evaluate_rollout(earlier)
        rollout_buffer.compute_returns(last_values, self.config.gamma, self.config.gae_lambda)
        n_steps = self.config.n_steps  # SB3's count at the rollout's end (steps 0 .. n - 1 while stepping)
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def _restart_unsettled(self, env: GroupVecEnv, step: GroupStep | None = None, present: Any = None) -> None:
        """Restart the copies a callback (an evaluation on the env instance training steps, e.g.
        ``GroupEvalCallback(env)``) played behind training's back, before the next action is drawn. With the step
        just taken, that step ends the episode training saw: its agents still there leave, truncated, with the
        observations after it (their bootstrap), as at a time limit. Outside a rollout, the copy starts afresh."""
        for e, (obs, mask) in env.restart_unsettled().items():
            if step is None:
                self._last_obs[e], self._last_mask[e] = obs, mask
                self._last_episode_starts[e] = True
                self._last_slot_starts[e] = True
                continue
            if not step.env_done[e]:
                staying = step.mask[e] & present[e]  # (an agent that joined at this step never acted)
                step.left[e] |= staying
                step.truncated[e] |= staying
                step.final_observations[e][staying] = step.observations[e][staying]
                step.env_done[e] = True
            step.observations[e], step.mask[e] = obs, mask

    @torch.no_grad()
    def _evaluate_rollout(self, earlier: _GroupEvaluated | None = None) -> np.ndarray:
        """Values, continuing values, baselines and old log-probs of the whole rollout in batched passes; returns
        V(last observations) per copy. ``earlier`` holds the steps already evaluated with the weights they acted
        with (see :meth:`_evaluate_steps`)."""
        buf, critic = self.rollout_buffer, self.critic
        if self.recurrent is not None:
            last_values, self._value_entropy = self.recurrent.evaluate(
                self.actor,
                critic,
                buf,
                torch.as_tensor(self._last_obs, dtype=buf.observations_tensor.dtype),
                torch.as_tensor(self._last_mask),
                self._last_episode_starts,
                _chunked,
            )
            return last_values
        earlier = earlier if earlier is not None else _GroupEvaluated(buf.n_steps * buf.n_envs)
        self._evaluate_steps(earlier, buf.n_steps, buf.n_steps)
        shape = (buf.n_steps, buf.n_envs)
        self._value_entropy = torch.cat(earlier.entropies).mean().item() if earlier.entropies else None
        buf.values_tensor = torch.cat(earlier.values).reshape(shape)
        buf.baselines_tensor = torch.cat(earlier.baselines).reshape(*shape, buf.n_slots)
        buf.log_probs_tensor = torch.cat(earlier.log_probs).reshape(*shape, buf.n_slots)
        buf.continuing_values = earlier.continuing.reshape(shape)
        last_obs = torch.as_tensor(self._last_obs, dtype=buf.observations_tensor.dtype)
        return critic.value(last_obs, torch.as_tensor(self._last_mask)).numpy()

    @torch.no_grad()
    def _evaluate_steps(self, earlier: _GroupEvaluated, end: int, truncated_until: int) -> None:
        """Evaluate the stored steps from ``earlier.end`` up to ``end`` (exclusive) with the weights in place:
        their values, baselines and old log-probs, and the continuing values of the steps before
        ``truncated_until`` (the state after a step, valued after its callbacks as SB3 values a truncation), in
        batched passes."""
        buf, critic = self.rollout_buffer, self.critic
        head = critic.value_head
        obs, actions, present = (
            buf.flat(buf.observations_tensor),
            buf.flat(buf.actions_tensor),
            buf.flat(buf.present_tensor),
        )
        stop = end * buf.n_envs
        for s in range(earlier.end * buf.n_envs, stop, _EVAL_CHUNK):
            sl = slice(s, min(s + _EVAL_CHUNK, stop))
            raw, raw_baseline = critic.raw(obs[sl], actions[sl], present[sl])
            earlier.values.append(head.value(raw))
            if head.distributional:
                earlier.entropies.append(head.entropy(raw))
            earlier.baselines.append(head.value(raw_baseline))
            o, a = obs[sl], actions[sl]
            lp, _ = self.actor.evaluate(o.reshape(-1, *o.shape[2:]), a.reshape(-1, *a.shape[2:]))
            earlier.log_probs.append(lp.reshape(o.shape[:2]))
        earlier.end = end
        # The continuing state is read only where an agent's trajectory ended without the group's terminal
        # (a leaver's bootstrap, a time limit): evaluate those group-steps alone (zeros elsewhere).
        first, stop = earlier.truncated_until * buf.n_envs, truncated_until * buf.n_envs
        if stop > first:
            ended = (buf.ended.any(axis=-1) & ~buf.group_terminal).reshape(-1)[first:stop]
            rows = torch.as_tensor(ended).nonzero().squeeze(1) + first
            if len(rows):
                cont_obs, cont_present = buf.flat(buf.continuing_obs)[rows], buf.flat(buf.continuing_present)[rows]
                earlier.continuing[rows] = _chunked(critic.value, cont_obs, cont_present)
            earlier.truncated_until = truncated_until

    def train(self) -> None:
        """Several epochs of minibatch updates of the shared policy and the critic."""
        cfg = self.config
        progress = self._current_progress_remaining
        self._relink_parameters()
        self._update_learning_rate(list(self._optimizers().values()))
        clip_range = scheduled(self.clip_range, progress, type(self).__name__, "clip_range")
        self.actor.set_training_mode(True)
        self.critic.train(True)
        history: list[dict[str, torch.Tensor]] = []
        ema = self.critic_ema.model if self.critic_ema is not None else None
        ema_coef = self.policy_config.critic_ema_coef
        buf = self.rollout_buffer
        advantages = buf.advantages_tensor  # as the rollout computed them, which the buffer keeps for callbacks
        if cfg.normalize_advantage:  # once over the update buffer's present agent-steps, as MA-POCA's
            buf.advantages_tensor = normalized_advantages(advantages, buf.present_tensor)
        try:
            last_epoch = self._epochs(clip_range, ema, ema_coef, history)
        finally:
            buf.advantages_tensor = advantages
        self._log_train(history, last_epoch, clip_range)

    def _epochs(self, clip_range: float, ema: Any, ema_coef: float, history: list) -> int:
        """``n_epochs`` passes of minibatch updates (fewer where ``target_kl`` stops them), their stats appended to
        ``history``. Returns the index in ``history`` of the last epoch's first minibatch."""
        cfg = self.config
        last_epoch = 0
        continue_training = True
        for epoch in range(cfg.n_epochs):
            last_epoch = len(history)
            if self.recurrent is not None:
                batches = (
                    self.recurrent.outputs(self.actor, self.critic, ema, self.rollout_buffer, rows)
                    for rows in self.recurrent.minibatches(cfg.batch_size)
                )
            else:
                batches = (
                    poca_outputs(batch, self.actor, self.critic, ema)
                    for batch in self.rollout_buffer.minibatches(cfg.batch_size)
                )
            for log_prob, entropy, raw_value, raw_baseline, ema_raw, batch in batches:
                if not bool(batch.present.any()):
                    continue
                head = self.critic.value_head
                loss, stats = poca_objective(
                    log_prob, entropy, raw_value, raw_baseline, head, batch, clip_range, cfg, ema_raw, ema_coef
                )
                history.append(stats)
                if cfg.target_kl is not None and stats["approx_kl"].item() > 1.5 * cfg.target_kl:
                    continue_training = False  # as SB3's PPO: this minibatch is not stepped, the update ends
                    if self.verbose >= 1:
                        print_early_stop(epoch, stats["approx_kl"].item())
                    break
                self._optimizer_step(loss, cfg.max_grad_norm)
            self._n_updates += 1
            if not continue_training:
                break
        return last_epoch

    def _log_train(self, history: list, last_epoch: int, clip_range: float) -> None:
        means = sb3_train_log(history, last_epoch)  # reduced as SB3's PPO logs them
        for key, value in means.items():
            self.logger.record(f"train/{key}", value)
        # under PPO's names too, so that one plot of PPO's and POCA's runs finds them: its entropy term, and the
        # policy's std for Box actions
        if "entropy" in means:  # (no minibatch held a present agent: nothing trained)
            self.logger.record("train/entropy_loss", -means["entropy"])
        log_std = getattr(self.actor.head, "log_std", None)
        if log_std is not None:
            self.logger.record("train/std", log_std.detach().exp().mean().item())
        buf = self.rollout_buffer
        present = buf.present_tensor
        values = buf.values_tensor[:, :, None].expand_as(buf.returns_tensor)[present]
        self.logger.record(
            "train/explained_variance", float(explained_variance(values.numpy(), buf.returns_tensor[present].numpy()))
        )
        self.logger.record("train/value_estimate", buf.values_tensor.mean().item())
        values = buf.values_tensor
        self.logger.record("train/value_std", values.std().item() if values.numel() > 1 else 0.0)  # one group-step
        self.logger.record("train/td_error_abs", buf.td_error_abs)
        if self._value_entropy is not None:
            self.logger.record("train/value_entropy", self._value_entropy)
        self.logger.record("train/baseline_estimate", buf.baselines_tensor[present].mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/clip_range", clip_range)

    def _dump_logs(self, iteration: int, counter: str | None = "time/iterations") -> None:
        self._record_group_stats()
        super()._dump_logs(iteration, counter)

    def _record_group_stats(self) -> None:
        if self.ep_info_buffer:
            self.logger.record(
                "rollout/ep_rew_agent_mean", float(np.mean([ep["r_agent"] for ep in self.ep_info_buffer]))
            )
        self.logger.record("time/agent_steps", self.agent_steps)


def refuse_ppo_only_settings(
    clip_range_vf: Any, use_sde: Any, sde_sample_freq: Any, rollout_buffer_class: Any, rollout_buffer_kwargs: Any
) -> None:
    """SB3 PPO's arguments that POCA has no counterpart for, given other than their defaults: an error that says
    why, where a PPO script moved to POCA would otherwise meet a bare TypeError."""
    given = {
        "clip_range_vf": (
            clip_range_vf is not None,
            "a scalar critic's value and baseline losses are clipped around the rollout's estimates by clip_range, the "
            "ratio's, as ML-Agents' POCA clips them",
        ),
        "use_sde": (
            bool(use_sde),
            "POCA has no state-dependent exploration (its Box actions are Gaussian, clipped to the bounds)",
        ),
        "sde_sample_freq": (sde_sample_freq != -1, "POCA has no state-dependent exploration"),
        "rollout_buffer_class": (
            rollout_buffer_class is not None,
            "POCA stores rollouts in its group buffer (every agent slot of every step, with presence masks)",
        ),
        "rollout_buffer_kwargs": (
            bool(rollout_buffer_kwargs),
            "POCA's group buffer takes its settings from POCA's own arguments (n_steps, gamma, gae_lambda)",
        ),
    }
    for name, (set_, why) in given.items():
        if set_:
            raise ValueError(f"POCA does not take {name}, SB3 PPO's setting: {why}. Remove {name}.")


def poca_loss(
    batch: GroupBatch,
    actor: Actor,
    critic: POCACritic,
    clip_range: float,
    cfg: POCAConfig,
    critic_ema: POCACritic | None = None,
    ema_coef: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MA-POCA's objective on a minibatch of group-steps (feed-forward networks): ``(loss, detached stats)``, in
    one call. Training calls :func:`poca_outputs` (or the recurrent networks' outputs) and :func:`poca_objective`
    itself, so that both kinds of networks share the objective."""
    log_prob, entropy, raw_value, raw_baseline, ema_raw, batch = poca_outputs(batch, actor, critic, critic_ema)
    return poca_objective(
        log_prob, entropy, raw_value, raw_baseline, critic.value_head, batch, clip_range, cfg, ema_raw, ema_coef
    )


def poca_outputs(batch: GroupBatch, actor: Actor, critic: POCACritic, critic_ema: POCACritic | None = None):
    """The feed-forward networks' outputs on a minibatch: log-probs and entropies of the present agents,
    raw values ``(B[, K])``, raw baselines ``(B, n_slots[, K])``, the EMA critic's (or None), the batch."""
    present = batch.present  # (B, S)
    select = _present_rows(present)
    log_prob, entropy = actor.evaluate(select(batch.observations), select(batch.actions))
    raw_value, raw_baseline = critic.raw(batch.observations, batch.actions, present)
    ema_raw = None
    if critic_ema is not None:
        with torch.no_grad():
            ema_raw = critic_ema.raw(batch.observations, batch.actions, present)
    return log_prob, entropy, raw_value, raw_baseline, ema_raw, batch


def normalized_advantages(advantages: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """``advantages`` ``(T, E, S)`` with their present entries normalized to mean 0 and standard deviation 1 over
    the whole update buffer, as MA-POCA normalizes them once before the epochs (a minibatch's own mean would set
    the sign of an agent-step by the steps shuffled in with it); absent entries stay 0."""
    values = advantages[present]
    if values.numel() < 2:
        return advantages
    out = torch.zeros_like(advantages)
    out[present] = (values - values.mean()) / (values.std() + 1e-8)
    return out


def poca_objective(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    raw_value: torch.Tensor,
    raw_baseline: torch.Tensor,
    head: torch.nn.Module,
    batch: GroupBatch,
    clip_range: float,
    cfg: POCAConfig,
    ema_raw: tuple[torch.Tensor, torch.Tensor] | None = None,
    ema_coef: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MA-POCA's loss from the networks' outputs on ``B`` group-steps (shared by feed-forward and recurrent
    training): ``(loss, detached stats)``.

    ``loss = policy + vf_coef * (value + baseline_coef * baseline) - ent_coef * entropy``; the value is
    trained toward every present agent's lambda-return, the baselines toward their own agent's. A scalar head's
    value and baseline losses are clipped around the rollout's estimates by ``clip_range`` too, the ratio's
    (ML-Agents' POCA clips them by its epsilon); PPO's ``clip_range_vf`` has no counterpart here.
    ``log_prob``/``entropy`` are over the present agent-steps (``batch.present`` order).
    """
    present = batch.present  # (B, S)
    select = _present_rows(present)
    advantages = select(batch.advantages)  # normalized over the update buffer already (normalize_advantage)
    policy_loss, approx_kl, clip_fraction = clipped_surrogate_loss(
        log_prob, select(batch.old_log_prob), advantages, clip_range
    )
    returns = select(batch.returns)

    def per_agent(raw: torch.Tensor) -> torch.Tensor:  # the group's value, once per present agent
        return select(raw[:, None].expand(-1, present.shape[1], *raw.shape[1:]))

    raw_value, raw_baseline = per_agent(raw_value), select(raw_baseline)
    if head.distributional:
        v_loss = head.loss(raw_value, returns).mean()
        b_loss = head.loss(raw_baseline, returns).mean()
    else:
        old_values = select(batch.old_values[:, None].expand_as(present))
        v_loss = value_loss(raw_value, old_values, returns, clip_range)
        b_loss = value_loss(raw_baseline, select(batch.old_baselines), returns, clip_range)
    entropy_mean = entropy.mean()
    stats = {}
    if ema_raw is not None:
        # The EMA copy pulls both of the critic's answers toward its own (it is never used for targets).
        ema_value, ema_baseline = per_agent(ema_raw[0]), select(ema_raw[1])
        ema_loss = ema_regularizer(raw_value, ema_value, head) + ema_regularizer(raw_baseline, ema_baseline, head)
        stats["critic_ema_loss"] = ema_loss.detach()
        v_loss = v_loss + ema_coef * ema_loss
    loss = policy_loss + cfg.vf_coef * (v_loss + cfg.baseline_coef * b_loss) - cfg.ent_coef * entropy_mean
    stats |= {
        "policy_gradient_loss": policy_loss.detach(),
        "value_loss": v_loss.detach(),
        "baseline_loss": b_loss.detach(),
        "entropy": entropy_mean.detach(),
        "approx_kl": approx_kl,
        "clip_fraction": clip_fraction,
        "loss": loss.detach(),
    }
    return loss, stats


RESHAPE_WHEN_ALL_PRESENT = True
"""Whether a minibatch in which every agent slot is present takes its present agent-steps as a reshape instead of
a boolean index (:func:`_present_rows`): the same rows in the same order, so the same loss and gradients to the
bit, without the index's gathers and its gradient's scatters (``python -m benchmarks.fast_paths --groups poca``)."""


def _present_rows(present: torch.Tensor):
    """``x -> x[present]`` for tensors ``(B, S, ...)`` and ``present`` ``(B, S)``: the present agent-steps, group
    by group. When every slot is present those are all of ``x``'s rows in order, which a reshape gives without
    the index and its gradient's scatter."""
    if RESHAPE_WHEN_ALL_PRESENT and bool(present.all()):
        return lambda x: x.reshape(-1, *x.shape[2:])
    return lambda x: x[present]


class _GroupEvaluated(_Evaluated):
    """PPO's record of the steps evaluated so far (values and old log-probs up to step ``end``), with a group's
    baselines and the two-hot critic's entropies beside them, and the continuing values of the ``n`` group-steps,
    filled before step ``truncated_until`` (a leaver's or a time limit's bootstrap, as PPO's truncations)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.baselines: list[torch.Tensor] = []
        self.entropies: list[torch.Tensor] = []
        self.continuing = torch.zeros(n, dtype=torch.float32)


def _chunked(fn, *tensors: torch.Tensor):
    """``fn`` over the first axis of ``tensors`` in chunks (bounded memory for the attention), concatenated
    (each output concatenated when ``fn`` returns a tuple)."""
    n = tensors[0].shape[0]
    chunks = [fn(*(x[s : s + _EVAL_CHUNK] for x in tensors)) for s in range(0, n, _EVAL_CHUNK)]
    if isinstance(chunks[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*chunks))
    return torch.cat(chunks)


def _hashable(agent: Any) -> Any:
    """An agent id as read back from JSON: a list was a tuple (lists are not hashable, so no id is one)."""
    return tuple(_hashable(part) for part in agent) if isinstance(agent, list) else agent

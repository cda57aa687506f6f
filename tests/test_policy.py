"""``model.policy`` answers SB3's policy calls: PPO's ``ActorCriticPolicy`` (forward, evaluate_actions,
get_distribution, predict_values) and SAC's ``SACPolicy`` (forward, actor/critic/critic_target, action
scaling), checked against torch.distributions and the model's own networks; SB3's documented recipes that
use the policy (ONNX export, parameter vectors) run unchanged."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
from envs import SpaceEnv, image_space
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from covey import PPO, SAC
from covey.networks.policies import ActionDistribution, ActorCriticPolicy, SACPolicy

FAST = dict(n_steps=32, batch_size=32, n_epochs=1, seed=0)
BOX_OBS = spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTION_SPACES = {
    "discrete": spaces.Discrete(3),
    "box": spaces.Box(-2.0, 2.0, (2,), np.float32),
    "multidiscrete": spaces.MultiDiscrete([2, 3]),
    "multibinary": spaces.MultiBinary(3),
}


def ppo_model(action_space: spaces.Space) -> PPO:
    return PPO("MlpPolicy", SpaceEnv(BOX_OBS, action_space), **FAST).learn(32)


def obs_batch(n: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.as_tensor(np.random.default_rng(seed).uniform(-1, 1, (n, 3)).astype(np.float32))


def torch_log_prob_entropy(space: spaces.Space, params: torch.Tensor, log_std, actions: torch.Tensor):
    """Log-probabilities and entropies ``(B,)`` by torch.distributions, independently of covey's heads."""
    d = torch.distributions
    if isinstance(space, spaces.Discrete):
        dist = d.Categorical(logits=params)
        return dist.log_prob(actions.reshape(-1).long()), dist.entropy()
    if isinstance(space, spaces.MultiDiscrete):
        parts = [d.Categorical(logits=p) for p in params.split(list(space.nvec), dim=-1)]
        log_prob = sum(dist.log_prob(actions[:, i].long()) for i, dist in enumerate(parts))
        return log_prob, sum(dist.entropy() for dist in parts)
    if isinstance(space, spaces.MultiBinary):
        dist = d.Bernoulli(logits=params)
        return dist.log_prob(actions.float()).sum(-1), dist.entropy().sum(-1)
    dist = d.Normal(params, log_std.exp().expand_as(params))
    return dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)


# ============================================================================================ PPO


def test_ppo_policy_holds_both_networks_as_sb3s_does():
    model = ppo_model(ACTION_SPACES["discrete"])
    policy = model.policy
    assert isinstance(policy, ActorCriticPolicy)
    assert policy.actor is model.actor and policy.critic is model.critic
    # parameters(), state_dict() and train() cover actor and critic together
    assert {id(p) for p in policy.parameters()} == {id(p) for p in model._params}
    assert {k.split(".")[0] for k in policy.state_dict()} == {"actor", "critic"}
    policy.set_training_mode(False)
    assert not model.actor.training and not model.critic.training
    policy.set_training_mode(True)
    assert model.actor.training and model.critic.training
    assert policy.optimizer is model.optimizer
    assert policy.observation_space == model.observation_space and policy.action_space == model.action_space
    assert policy.squash_output is False
    assert policy.action_net is model.actor.head.proj and policy.value_net is model.critic.value_head.proj
    assert policy.features_extractor is model.actor.encoder
    assert policy.share_features_extractor == (model.actor.encoder is model.critic.encoder)


@pytest.mark.cpu
@pytest.mark.parametrize("kind", sorted(ACTION_SPACES))
def test_ppo_policy_forward_evaluate_and_distribution_match_torch_distributions(kind):
    space = ACTION_SPACES[kind]
    model = ppo_model(space)
    policy, obs = model.policy, obs_batch()
    with torch.no_grad():
        params = model.actor.distribution_params(obs)
        values = model.critic(obs)
        log_std = model.actor.log_std

        torch.manual_seed(0)
        actions, values_f, log_prob_f = policy(obs)
        assert actions.shape == (7, *space.shape)
        assert values_f.shape == (7, 1) and log_prob_f.shape == (7,)
        torch.testing.assert_close(values_f, values.unsqueeze(-1))
        expected_lp, expected_ent = torch_log_prob_entropy(space, params, log_std, actions)
        torch.testing.assert_close(log_prob_f, expected_lp, rtol=1e-5, atol=1e-5)

        # SB3's rollout buffer stores Discrete actions as float (B, 1); evaluate_actions takes them so
        sb3_actions = actions.float().reshape(7, -1)
        values_e, log_prob_e, entropy_e = policy.evaluate_actions(obs, sb3_actions)
        assert values_e.shape == (7, 1) and log_prob_e.shape == (7,) and entropy_e.shape == (7,)
        torch.testing.assert_close(values_e, values.unsqueeze(-1))
        torch.testing.assert_close(log_prob_e, expected_lp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(entropy_e, expected_ent, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(policy.predict_values(obs), values.unsqueeze(-1))

        dist = policy.get_distribution(obs)
        assert isinstance(dist, ActionDistribution)
        torch.testing.assert_close(dist.log_prob(sb3_actions), expected_lp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dist.entropy(), expected_ent, rtol=1e-5, atol=1e-5)
        mode = dist.mode()
        assert mode.shape == (7, *space.shape)
        torch.testing.assert_close(policy(obs, deterministic=True)[0], mode)
        torch.testing.assert_close(policy._predict(obs, deterministic=True), mode)
        assert dist.sample().shape == (7, *space.shape)
        if kind == "discrete":
            assert isinstance(dist.distribution, torch.distributions.Categorical)
            torch.testing.assert_close(dist.distribution.probs, params.softmax(-1))
            torch.testing.assert_close(mode, params.argmax(-1))
        if kind == "box":
            assert isinstance(dist.distribution, torch.distributions.Normal)
            torch.testing.assert_close(dist.distribution.mean, params)
            torch.testing.assert_close(dist.distribution.stddev, log_std.exp().expand_as(params))
            torch.testing.assert_close(mode, params)
        if kind == "multidiscrete":
            assert [c.probs.shape for c in dist.distribution] == [(7, 2), (7, 3)]

    # deterministic actions are predict()'s, before its clipping to the bounds
    expected = model.predict(obs.numpy(), deterministic=True)[0]
    if kind == "box":
        np.testing.assert_allclose(expected, np.clip(mode.numpy(), space.low, space.high), rtol=1e-6)
    else:
        np.testing.assert_array_equal(expected, mode.numpy())


@pytest.mark.cpu
def test_ppo_evaluate_actions_gradients_reach_actor_and_critic():
    """SB3 code trains through evaluate_actions (e.g. behaviour cloning): its outputs carry gradients."""
    model = ppo_model(ACTION_SPACES["box"])
    obs = obs_batch()
    values, log_prob, entropy = model.policy.evaluate_actions(obs, torch.zeros(7, 2))
    (values.sum() + log_prob.sum() + entropy.sum()).backward()
    for net in (model.actor, model.critic):
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.trunk.parameters())


@pytest.mark.cpu
def test_ppo_policy_takes_dict_observations():
    space = spaces.Dict({"a": BOX_OBS, "b": spaces.Discrete(4)})
    model = PPO("MultiInputPolicy", SpaceEnv(space, spaces.Discrete(2)), **FAST).learn(32)
    obs = {"a": obs_batch(5), "b": torch.tensor([0, 1, 2, 3, 0])}
    with torch.no_grad():
        actions, values, log_prob = model.policy(obs, deterministic=True)
    np.testing.assert_array_equal(
        actions.numpy(), model.predict({"a": obs["a"].numpy(), "b": obs["b"].numpy()}, deterministic=True)[0]
    )
    assert values.shape == (5, 1) and log_prob.shape == (5,)


@pytest.mark.cpu
def test_policy_state_dict_and_parameter_vector_round_trip():
    """SB3's "accessing and modifying model parameters" recipes: state_dict copies, parameter vectors."""
    model_a = ppo_model(ACTION_SPACES["discrete"])
    model_b = PPO("MlpPolicy", SpaceEnv(BOX_OBS, ACTION_SPACES["discrete"]), **{**FAST, "seed": 1})
    obs = obs_batch()
    with torch.no_grad():
        logits_a = model_a.actor.distribution_params(obs)
        assert not torch.allclose(model_b.actor.distribution_params(obs), logits_a)
        model_b.policy.load_state_dict(model_a.policy.state_dict())
        torch.testing.assert_close(model_b.actor.distribution_params(obs), logits_a, rtol=0, atol=0)
        torch.testing.assert_close(model_b.critic(obs), model_a.critic(obs), rtol=0, atol=0)

    vector = model_a.policy.parameters_to_vector()
    assert vector.shape == (sum(p.numel() for p in model_a.policy.parameters()),)
    model_a.policy.load_from_vector(vector + 1.0)
    with torch.no_grad():
        assert not torch.allclose(model_a.actor.distribution_params(obs), logits_a)
    model_a.policy.load_from_vector(vector)
    with torch.no_grad():
        torch.testing.assert_close(model_a.actor.distribution_params(obs), logits_a, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"parameters: \(\d+,\)"):
        model_a.policy.load_from_vector(vector[:-1])


def test_ppo_acts_and_trains_from_parameters_whose_data_was_replaced():
    """torch's ``vector_to_parameters`` (which SB3's ``load_from_vector`` calls) replaces each parameter's
    ``.data``. The next ``learn`` acts with the new values (PPO acts in NumPy from views of its flat buffer) and
    its optimizer steps them."""
    model = PPO("MlpPolicy", SpaceEnv(BOX_OBS, ACTION_SPACES["discrete"]), **{**FAST, "learning_rate": 0.0})
    assert model._numpy_acting is not None
    with torch.no_grad():
        bias = model.actor.head.proj.bias.clone()
        bias[:] = torch.tensor([-50.0, -50.0, 50.0])  # action 2 for any observation
        new = [bias if p is model.actor.head.proj.bias else p.clone() for p in model.policy.parameters()]
    torch.nn.utils.vector_to_parameters(torch.cat([p.reshape(-1) for p in new]), model.policy.parameters())
    model.learn(32)
    assert (model.rollout_buffer.actions == 2).all()
    assert model.actor.head.proj.bias.data_ptr() - model.optimizer.flat_parameters.data.data_ptr() in range(
        model.optimizer.flat_parameters.data.numel() * 4
    )
    torch.testing.assert_close(model.actor.head.proj.bias.detach(), bias, rtol=0, atol=0)  # lr 0: Adam kept it


@pytest.mark.parametrize("when", ["rollout_start", "step"])
def test_ppo_acts_from_parameters_a_callback_replaced_during_the_rollout(when):
    """A callback that replaces the parameters' ``.data`` (``vector_to_parameters``) at the start of a rollout or
    between its steps: the steps after it act with the new values, as SB3's PPO does, and the rollout's
    log-probabilities are the new policy's."""
    switch_at = 0 if when == "rollout_start" else 10

    class ForceAction2(BaseCallback):
        def replace(self) -> None:
            with torch.no_grad():
                new = [p.clone() for p in self.model.policy.parameters()]
                for p, q in zip(self.model.policy.parameters(), new):
                    if p is self.model.actor.head.proj.bias:
                        q[:] = torch.tensor([-50.0, -50.0, 50.0])  # action 2 for any observation
            torch.nn.utils.vector_to_parameters(torch.cat([q.reshape(-1) for q in new]), self.model.policy.parameters())

        def _on_rollout_start(self) -> None:
            if when == "rollout_start":
                self.replace()

        def _on_step(self) -> bool:
            if when == "step" and self.n_calls == switch_at:
                self.replace()
            return True

    model = PPO("MlpPolicy", SpaceEnv(BOX_OBS, ACTION_SPACES["discrete"]), **{**FAST, "learning_rate": 0.0})
    assert model._numpy_acting is not None
    model.learn(32, callback=ForceAction2())
    actions = model.rollout_buffer.actions.reshape(-1)
    assert (actions[switch_at:] == 2).all()
    if switch_at:
        assert not (actions[:switch_at] == 2).all()  # the steps before it acted with the old values
    np.testing.assert_allclose(model.rollout_buffer.log_probs.reshape(-1)[switch_at:], 0.0, atol=1e-6)


def test_ppo_keeps_each_steps_log_prob_under_the_std_it_acted_with():
    """A callback that anneals log_std at every step: each stored old log-prob is the action's density under the
    std it was sampled with, as SB3 stores it while acting (covey computes them after the rollout, and computed
    them all with the last step's std: step 0's was -934 where -2.5 is right)."""
    expected = []

    class Anneal(BaseCallback):
        def _on_step(self) -> bool:
            with torch.no_grad():
                self.model.policy.log_std.fill_(-0.1 * self.n_calls)  # step k acts with log_std -0.1 k
            return True

        def _on_rollout_end(self) -> None:
            buffer = self.model.rollout_buffer
            obs = torch.as_tensor(buffer.observations.reshape(32, -1))
            with torch.no_grad():
                mean = self.model.policy.get_distribution(obs).distribution.mean  # only log_std moved
            std = torch.exp(-0.1 * torch.arange(32.0))[:, None]
            actions = torch.as_tensor(buffer.actions.reshape(32, -1))
            expected.append(torch.distributions.Normal(mean, std).log_prob(actions).sum(dim=1))
            self.stored = torch.as_tensor(buffer.log_probs.reshape(-1)).clone()

    anneal = Anneal()
    PPO("MlpPolicy", "Pendulum-v1", **FAST).learn(32, callback=anneal)
    torch.testing.assert_close(anneal.stored, expected[0], rtol=1e-5, atol=1e-4)


def test_ppo_values_steps_and_truncations_with_the_weights_in_place_when_sb3s_does():
    """A callback that changes actor and critic at step 10 of a rollout: steps 0-9 keep the old policy's values and
    log-probs, the others the new one's; a truncation is valued after its step's callbacks, as in SB3 (the old
    critic before step 9, the new from step 9)."""
    switch = 10
    finals = []

    class Change(BaseCallback):
        def _on_step(self) -> bool:
            if self.n_calls == switch:
                with torch.no_grad():
                    self.model.policy.value_net.bias += 5.0
                    self.model.actor.head.proj.bias += torch.tensor([3.0, 0.0, -3.0])
            for i, info in enumerate(self.locals["infos"]):
                if info.get("TimeLimit.truncated"):
                    finals.append((self.locals["n_steps"], i, info["terminal_observation"]))
            return True

    env = SpaceEnv(BOX_OBS, ACTION_SPACES["discrete"], episode_length=3, truncate=True)
    model = PPO("MlpPolicy", env, **{**FAST, "learning_rate": 0.0})
    old = copy.deepcopy(model)
    model.learn(32, callback=Change())
    buffer = model.rollout_buffer
    obs, actions = torch.as_tensor(buffer.observations.reshape(32, -1)), torch.as_tensor(buffer.actions.reshape(-1))
    with torch.no_grad():
        old_values, old_log_probs, _ = old.policy.evaluate_actions(obs, actions)
        new_values, new_log_probs, _ = model.policy.evaluate_actions(obs, actions)
    log_probs, values = torch.as_tensor(buffer.log_probs.reshape(-1)), torch.as_tensor(buffer.values.reshape(-1))
    torch.testing.assert_close(log_probs[:switch], old_log_probs[:switch])
    torch.testing.assert_close(log_probs[switch:], new_log_probs[switch:])
    torch.testing.assert_close(values[:switch], old_values.reshape(-1)[:switch])
    torch.testing.assert_close(values[switch:], new_values.reshape(-1)[switch:])
    assert {step for step, _, _ in finals} >= {2, 5, 8, 11}
    for step, i, final in finals:
        critic = old if step < switch - 1 else model
        with torch.no_grad():
            value = critic.policy.predict_values(torch.as_tensor(final)[None]).item()
        assert buffer.truncation_values[step, i] == pytest.approx(value, abs=1e-5), step


@pytest.mark.parametrize("agent", ["recurrent PPO", "recurrent POCA"])
def test_a_weight_change_inside_a_rollout_is_named_where_the_rollout_is_evaluated_after_it(agent):
    """Recurrent PPO and POCA evaluate a rollout after it, with the weights at its end: a callback's change between
    steps is named, with where to make it instead."""

    class Change(BaseCallback):
        def _on_step(self) -> bool:
            if self.n_calls == 3:
                with torch.no_grad():
                    next(self.model.actor.parameters()).add_(0.1)
            return True

    if agent == "recurrent POCA":
        from covey import POCA
        from covey.envs import GroupCueEnv

        model = POCA("MlpLstmPolicy", GroupCueEnv, n_steps=8, batch_size=8, n_epochs=1, seed=0)
    else:
        model = PPO("MlpLstmPolicy", "CartPole-v1", **FAST)
    with pytest.warns(UserWarning, match="changed the policy's weights between the steps.*_on_rollout_end"):
        model.learn(8, callback=Change())


@pytest.mark.parametrize(
    "where, name",
    [
        ("policy", "action_net"),
        ("policy", "value_net"),
        ("policy", "mlp_extractor"),
        ("policy", "features_extractor"),
        ("sac actor", "mu"),
        ("sac actor", "latent_pi"),
        ("sac critic", "features_extractor"),
        ("sac critic", "qf0"),
    ],
)
def test_assigning_a_module_to_sb3s_name_for_a_part_of_the_network_is_refused(where, name):
    """SB3's transfer-learning habit, policy.action_net = nn.Linear(...): covey's action_net is a view of its own
    head, so nn.Module.__setattr__ registered the new module beside the network, where it neither acted nor
    trained. It is refused, naming what works; the view stays the network's own."""
    if where == "policy":
        owner = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32).policy
    else:
        model = SAC("MlpPolicy", "Pendulum-v1", buffer_size=100)
        owner = model.actor if where == "sac actor" else model.critic
    before = getattr(owner, name)
    with pytest.raises(AttributeError, match=rf"\.{name} is SB3's name for a part of covey's network.*in place"):
        setattr(owner, name, torch.nn.Linear(4, 4))
    assert type(getattr(owner, name)) is type(before)
    assert name not in owner._modules


@pytest.mark.parametrize("agent", ["PPO", "SAC"])
def test_a_parameter_or_layer_replaced_by_another_object_is_refused_at_learn(agent):
    """policy.action_net.bias = nn.Parameter(...) (or a new layer in place of one) left the optimizer, NumPy acting
    and the updates with the old parameter: predict acted with the new one, learn with the old one, and the new one
    never trained. learn refuses it, naming the parameter; values changed in place train on."""
    if agent == "PPO":
        model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0)
        layer = model.policy.action_net
    else:
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=8, batch_size=8, seed=0)
        layer = model.critic.qs[0].head.proj
    with torch.no_grad():
        layer.bias.add_(0.5)  # in place: taken
    model.learn(32)
    layer.bias = torch.nn.Parameter(layer.bias.detach() + 1.0)
    with pytest.raises(ValueError, match=r"1 of this model's parameters were replaced .*proj\.bias.*in place"):
        model.learn(32)
    fresh = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32) if agent == "PPO" else None
    model = fresh or SAC("MlpPolicy", "Pendulum-v1", learning_starts=8, batch_size=8, seed=0)
    owner = model.actor.head if agent == "PPO" else model.critic.qs[0].head
    owner.proj = torch.nn.Linear(owner.proj.in_features, owner.proj.out_features)
    with pytest.raises(ValueError, match=r"2 of this model's parameters were replaced"):
        model.learn(32)
    if agent == "SAC":  # the learned temperature, which no network holds, after a learn too
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=8, batch_size=8, seed=0).learn(16)
        model.log_ent_coef = torch.zeros(1, requires_grad=True)
        with pytest.raises(ValueError, match=r"1 of this model's parameters were replaced .*\(log_ent_coef\)"):
            model.learn(16)
    # a whole network in place of one (SAC's actor has an optimizer, and a flat buffer, of its own)
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32) if agent == "PPO" else None
    model = model or SAC("MlpPolicy", "Pendulum-v1", learning_starts=8, batch_size=8, seed=0)
    model.policy.actor = copy.deepcopy(model.actor)
    n = len(list(model.actor.parameters()))
    with pytest.raises(ValueError, match=rf"{n} of this model's parameters were replaced .*policy\.actor\."):
        model.learn(32)


def test_sac_target_critics_follow_critics_whose_data_was_replaced():
    """The Polyak update runs over the target critics' flat buffer: after their ``.data`` is replaced, the next
    ``learn`` takes the new values back into it, so the update moves the target critics themselves."""
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=0, batch_size=8, learning_rate=0.0, tau=0.5, seed=0)
    for p in model.critic_target.parameters():
        p.data = torch.zeros_like(p)
    model.learn(1)  # one gradient step (learning rate 0: the critics stay), one Polyak update
    for target, critic in zip(model.critic_target.parameters(), model.critic.parameters()):
        torch.testing.assert_close(target, 0.5 * critic.detach())


@pytest.mark.cpu
def test_ppo_policy_after_load(tmp_path):
    model = ppo_model(ACTION_SPACES["box"])
    model.save(tmp_path / "m")
    loaded = PPO.load(tmp_path / "m")
    assert isinstance(loaded.policy, ActorCriticPolicy) and loaded.policy.actor is loaded.actor
    obs = obs_batch()
    with torch.no_grad():
        for a, b in zip(model.policy(obs, deterministic=True), loaded.policy(obs, deterministic=True)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.cpu
@pytest.mark.parametrize("kind", ["discrete", "multidiscrete", "box"])
def test_sb3_onnx_export_recipe_runs_on_the_ppo_policy(kind, tmp_path):
    """SB3's documented ONNX recipe: a module returning policy(obs, deterministic=True), exported with
    torch.onnx.export, gives the policy's actions, values and log-probabilities in onnxruntime."""

    class OnnxablePolicy(torch.nn.Module):
        def __init__(self, policy):
            super().__init__()
            self.policy = policy

        def forward(self, observation):
            return self.policy(observation, deterministic=True)

    model = ppo_model(ACTION_SPACES[kind])
    path = tmp_path / "policy.onnx"
    torch.onnx.export(OnnxablePolicy(model.policy), torch.randn(1, 3), path, opset_version=17, input_names=["input"])
    obs = obs_batch(1, seed=3)
    outputs = ort.InferenceSession(str(path)).run(None, {"input": obs.numpy()})
    with torch.no_grad():
        expected = model.policy(obs, deterministic=True)
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    predicted = model.predict(obs.numpy()[0], deterministic=True)[0]
    if kind == "box":  # predict clips to the bounds
        predicted_mean = np.clip(outputs[0][0], ACTION_SPACES[kind].low, ACTION_SPACES[kind].high)
        np.testing.assert_allclose(predicted, predicted_mean, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(outputs[0][0], predicted)


@pytest.mark.cpu
def test_policy_refuses_numpy_observations_and_recurrent_calls_without_memory():
    model = ppo_model(ACTION_SPACES["discrete"])
    with pytest.raises(TypeError, match=r"obs_to_tensor"):
        model.policy(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match=r"torch.as_tensor"):
        model.policy.evaluate_actions(obs_batch(2), np.zeros(2))
    recurrent = PPO("MlpLstmPolicy", SpaceEnv(BOX_OBS, spaces.Discrete(2)), **FAST)
    with pytest.raises(NotImplementedError, match=r"model.predict\(obs, state=state, episode_start"):
        recurrent.policy(obs_batch(2))
    with pytest.raises(NotImplementedError, match=r"recurrent"):
        recurrent.policy.predict_values(obs_batch(2))
    actions, state = recurrent.policy.predict(np.zeros((2, 3), np.float32))
    assert actions.shape == (2,) and state is not None


class RolloutReader(BaseCallback):
    """At the end of each rollout (before the update), reads the buffer the way SB3 code does."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buffer = self.model.rollout_buffer
        assert buffer.size() == 16
        with torch.no_grad():
            for batch in buffer.get(48):
                values, log_prob, _ = self.model.policy.evaluate_actions(batch.observations, batch.actions)
                self.batches.append((batch, values, log_prob))


@pytest.mark.parametrize("kind", ["discrete", "box"])
def test_rollout_buffer_get_gives_sb3s_samples_that_match_the_policy(kind):
    """SB3's ``rollout_buffer.get(batch_size)`` pattern: minibatches with SB3's field names whose stored
    values and log-probabilities are what ``policy.evaluate_actions`` gives before the update."""
    env = make_vec_env(lambda: SpaceEnv(BOX_OBS, ACTION_SPACES[kind]), n_envs=6, seed=0)
    reader = RolloutReader()
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0)
    model.learn(96, callback=reader)
    sizes = [len(batch.returns) for batch, _, _ in reader.batches]
    assert sizes == [48, 48]
    for batch, values, log_prob in reader.batches:
        assert set(batch._fields) == {"observations", "actions", "old_values", "old_log_prob", "advantages", "returns"}
        # SB3's actions: float32 (batch, action_dim), a Discrete action one column, which torch.cat takes beside the
        # observations (a curiosity model's input)
        assert batch.actions.dtype == torch.float32 and batch.actions.shape == (48, 1 if kind == "discrete" else 2)
        assert torch.cat([batch.observations, batch.actions], dim=1).shape == (48, 3 + batch.actions.shape[1])
        torch.testing.assert_close(values.flatten(), batch.old_values, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(log_prob, batch.old_log_prob, rtol=1e-5, atol=1e-5)
    stored = torch.cat([batch.returns for batch, _, _ in reader.batches]).sort().values
    torch.testing.assert_close(stored, model.rollout_buffer.returns_tensor.flatten().sort().values)  # every sample once
    model.rollout_buffer.reset()
    with pytest.raises(ValueError, match=r"holds 0 of its 16 steps"):
        next(model.rollout_buffer.get())


# ============================================================================================ SAC


def sac_model() -> SAC:
    return SAC("MlpPolicy", "Pendulum-v1", learning_starts=16, batch_size=16, seed=0).learn(32)


@pytest.mark.cpu
def test_sac_policy_is_sb3s_sacpolicy():
    model = sac_model()
    policy = model.policy
    assert isinstance(policy, SACPolicy)
    assert policy.actor is model.actor and policy.critic is model.critic
    assert policy.critic_target is model.critic_target
    assert policy.squash_output is True
    assert {k.split(".")[0] for k in policy.state_dict()} == {"actor", "critic", "critic_target"}
    policy.set_training_mode(False)
    assert not model.actor.training and not model.critic.training and not policy.training
    policy.set_training_mode(True)
    assert model.actor.training and model.critic.training and policy.training

    obs = torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, (6, 3)).astype(np.float32))
    with torch.no_grad():
        mean = model.actor.distribution_params(obs)[:, :1]
        deterministic = policy(obs, deterministic=True)
        torch.testing.assert_close(deterministic, torch.tanh(mean))
        torch.testing.assert_close(policy._predict(obs, deterministic=True), deterministic)
        sampled = policy(obs)
    assert sampled.shape == (6, 1) and bool((sampled.abs() <= 1).all())
    # predict() is forward's action rescaled to the bounds ([-2, 2] for Pendulum)
    predicted = model.predict(obs.numpy(), deterministic=True)[0]
    np.testing.assert_allclose(predicted, policy.unscale_action(deterministic.numpy()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(predicted, 2.0 * deterministic.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(policy.scale_action(predicted), deterministic.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("share", [False, True])
def test_sac_actor_and_critics_answer_sb3s_attribute_names(share):
    """SB3's SAC Actor and ContinuousCritic have features_extractor (the user's extractor object), features_dim and
    n_critics; scripts read them (they were AttributeErrors)."""
    import stable_baselines3 as sb3
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class Extractor(BaseFeaturesExtractor):
        def __init__(self, observation_space, features_dim=16):
            super().__init__(observation_space, features_dim)
            self.net = torch.nn.Sequential(torch.nn.Linear(3, features_dim), torch.nn.ReLU())

        def forward(self, x):
            return self.net(x)

    kwargs = dict(
        features_extractor_class=Extractor,
        features_extractor_kwargs=dict(features_dim=12),
        n_critics=3,
        share_features_extractor=share,
    )
    models = [agent("MlpPolicy", "Pendulum-v1", policy_kwargs=kwargs, seed=0) for agent in (SAC, sb3.SAC)]
    answers = []
    for model in models:
        actor, critic = model.actor, model.critic
        assert type(actor.features_extractor) is Extractor and type(critic.features_extractor) is Extractor
        answers.append((actor.features_dim, critic.n_critics, actor.features_extractor is critic.features_extractor))
    assert answers[0] == answers[1] == (12, 3, share)
    assert models[0].critic_target.n_critics == 3


@pytest.mark.cpu
def test_sac_actor_action_log_prob_is_the_squashed_gaussians():
    """SB3 SAC's ``model.actor.action_log_prob(obs)``: a reparameterized action in [-1, 1] and its
    log-probability with the tanh change of variables, checked against torch.distributions."""
    model = sac_model()
    obs = torch.as_tensor(np.random.default_rng(1).uniform(-1, 1, (6, 3)).astype(np.float32))
    actions, log_prob = model.actor.action_log_prob(obs)
    assert actions.shape == (6, 1) and log_prob.shape == (6,) and actions.requires_grad
    with torch.no_grad():
        dist = ActionDistribution(
            model.actor.head, model.actor.distribution_params(obs), model.action_space
        ).distribution
        u = torch.atanh(actions.detach().clamp(-1 + 1e-6, 1 - 1e-6))
        expected = dist.log_prob(u).sum(-1) - torch.log1p(-actions.detach().pow(2) + 1e-12).sum(-1)
    torch.testing.assert_close(log_prob.detach(), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.cpu
def test_sac_policy_on_discrete_actions():
    model = SAC("MlpPolicy", SpaceEnv(BOX_OBS, spaces.Discrete(3)), learning_starts=8, batch_size=8, seed=0).learn(16)
    obs = obs_batch(4)
    with torch.no_grad():
        actions = model.policy(obs, deterministic=True)
    np.testing.assert_array_equal(actions.numpy(), model.predict(obs.numpy(), deterministic=True)[0])
    assert model.policy.squash_output is False


@pytest.mark.cpu
def test_sac_critics_answer_as_sb3s_continuous_critic():
    """``model.critic(obs, actions)`` is a tuple of one ``(B, 1)`` tensor per critic, so SB3's
    ``torch.cat(model.critic(obs, actions), dim=1)`` works; ``q1_forward`` is the first critic's."""
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=16, batch_size=16, seed=0, policy_kwargs=dict(n_critics=3))
    model.learn(32)
    obs = torch.as_tensor(np.random.default_rng(2).uniform(-1, 1, (5, 3)).astype(np.float32))
    actions = torch.as_tensor(np.random.default_rng(3).uniform(-1, 1, (5, 1)).astype(np.float32))
    with torch.no_grad():
        stacked = model.critic.values(obs, actions)  # (3, 5): what training uses
        qs = model.critic(obs, actions)
        q1 = model.critic.q1_forward(obs, actions)
        targets = model.critic_target(obs, actions)
    assert isinstance(qs, tuple) and len(qs) == 3 and all(q.shape == (5, 1) for q in qs)
    torch.testing.assert_close(torch.cat(qs, dim=1), stacked.T)
    assert q1.shape == (5, 1)
    torch.testing.assert_close(q1, qs[0])
    # each critic is its own network: different values (the target critics are copies of them until trained)
    assert not torch.allclose(qs[0], qs[1])
    assert len(targets) == 3 and targets[0].shape == (5, 1)


@pytest.mark.cpu
def test_sac_discrete_critics_give_one_value_per_action():
    model = SAC("MlpPolicy", SpaceEnv(BOX_OBS, spaces.Discrete(3)), learning_starts=8, batch_size=8, seed=0).learn(16)
    obs = obs_batch(4)
    with torch.no_grad():
        qs = model.critic(obs)
        q1 = model.critic.q1_forward(obs)
    assert len(qs) == 2 and all(q.shape == (4, 3) for q in qs)
    torch.testing.assert_close(q1, qs[0])
    torch.testing.assert_close(torch.stack(qs), model.critic.values(obs))


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_get_parameters_has_sb3s_groups_and_policy_state(name):
    """``get_parameters()`` names its groups as SB3's does (``policy``, ``policy.optimizer``, ...), and
    ``"policy"`` is ``model.policy.state_dict()``: SB3 code that copies it into another policy works."""
    import stable_baselines3

    import covey

    kwargs = dict(n_steps=16, batch_size=16) if name == "PPO" else dict(learning_starts=8, batch_size=8)
    env_id = "CartPole-v1" if name == "PPO" else "Pendulum-v1"
    sb3_model = getattr(stable_baselines3, name)("MlpPolicy", env_id, seed=0, **kwargs)
    model_a = getattr(covey, name)("MlpPolicy", env_id, seed=0, **kwargs).learn(32)
    model_b = getattr(covey, name)("MlpPolicy", env_id, seed=1, **kwargs)
    params = model_a.get_parameters()
    extra = {"ent_coef"} if name == "SAC" else set()  # SAC's learned temperature, which SB3 saves apart
    assert set(params) == set(sb3_model.get_parameters()) | extra
    assert params["policy"].keys() == model_a.policy.state_dict().keys()
    model_b.policy.load_state_dict(params["policy"])
    obs = np.zeros((3, *model_a.observation_space.shape), np.float32)
    predicted = [model.predict(obs, deterministic=True)[0] for model in (model_a, model_b)]
    np.testing.assert_array_equal(*predicted)
    with pytest.raises(ValueError, match=r"Unknown parameter groups \['actors'\]"):
        model_b.set_parameters({"actors": {}})


@pytest.mark.cpu
def test_sb3_sac_onnx_recipe_runs_on_the_sac_actor(tmp_path):
    """SB3's ONNX recipe for SAC calls ``model.policy.actor(obs, deterministic=True)``: covey's actor answers
    a call with actions (squashed into [-1, 1]), as SB3's does, and exports with it."""

    class OnnxableActor(torch.nn.Module):
        def __init__(self, actor):
            super().__init__()
            self.actor = actor

        def forward(self, observation):
            return self.actor(observation, deterministic=True)

    model = sac_model()
    obs = torch.as_tensor(np.random.default_rng(4).uniform(-1, 1, (1, 3)).astype(np.float32))
    with torch.no_grad():
        actions = model.policy.actor(obs, deterministic=True)
        torch.testing.assert_close(actions, model.policy(obs, deterministic=True))
        sampled = model.actor(obs)
    assert actions.shape == sampled.shape == (1, 1) and bool((sampled.abs() <= 1).all())
    path = tmp_path / "actor.onnx"
    torch.onnx.export(OnnxableActor(model.policy.actor), torch.randn(1, 3), path, opset_version=17)
    session = ort.InferenceSession(str(path))
    (onnx_actions,) = session.run(None, {session.get_inputs()[0].name: obs.numpy()})
    np.testing.assert_allclose(onnx_actions, actions.numpy(), rtol=1e-5, atol=1e-6)
    # rescaled to Pendulum's bounds, they are predict()'s
    predicted = model.predict(obs.numpy(), deterministic=True)[0]
    np.testing.assert_allclose(model.policy.unscale_action(onnx_actions), predicted, rtol=1e-5, atol=1e-5)


@pytest.mark.cpu
@pytest.mark.parametrize("use_sde", [False, True])
def test_sb3_older_sac_onnx_recipe_latent_pi_then_mu(tmp_path, use_sde):
    """SB3's older SAC recipe exports ``nn.Sequential(actor.latent_pi, actor.mu)``: the mean before the tanh
    (with gSDE clipped to clip_mean), as SB3's own actor of the same weights computes it."""
    model = SAC("MlpPolicy", "Pendulum-v1", use_sde=use_sde, learning_starts=10, seed=0).learn(20)
    theirs = model.to_sb3_model()
    obs = torch.as_tensor(np.random.default_rng(5).uniform(-8, 8, (6, 3)).astype(np.float32))
    ours = torch.nn.Sequential(model.actor.latent_pi, model.actor.mu)
    with torch.no_grad():
        mean = ours(obs)
        torch.testing.assert_close(mean, torch.nn.Sequential(theirs.actor.latent_pi, theirs.actor.mu)(obs))
        torch.testing.assert_close(torch.tanh(mean), model.actor(obs, deterministic=True))
    assert not any(name.startswith("mu") for name, _ in model.actor.named_parameters())  # no new names in files
    path = tmp_path / "mean.onnx"
    torch.onnx.export(ours, torch.randn(1, 3), path, opset_version=17, dynamo=False)
    session = ort.InferenceSession(str(path))
    (onnx_mean,) = session.run(None, {session.get_inputs()[0].name: obs[:1].numpy()})
    np.testing.assert_allclose(onnx_mean, mean[:1].numpy(), rtol=1e-5, atol=1e-6)
    assert not hasattr(PPO("MlpPolicy", "Pendulum-v1").actor, "mu")  # SB3's PPO has none either


@pytest.mark.parametrize("agent", ["ppo", "sac"])
def test_sb3s_torchscript_recipes_trace_without_warnings_and_generalize_over_the_batch(agent):
    """SB3's TorchScript recipes trace ``model.policy`` (PPO) or the SAC actor at one batch size; covey's layers
    recorded their batch-size tests in the trace, which warned (a TracerWarning each) that the trace might not
    generalize. They take ``F.linear`` under the tracer, so the trace runs any batch."""

    class Deterministic(torch.nn.Module):
        def __init__(self, policy):
            super().__init__()
            self.policy = policy

        def forward(self, observation):
            out = self.policy(observation, deterministic=True)
            return out[0] if isinstance(out, tuple) else out

    if agent == "ppo":
        module = Deterministic(PPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=64, seed=0).policy)
    else:
        module = Deterministic(sac_model().policy.actor)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(module, torch.randn(256, 3))
    obs = torch.as_tensor(np.random.default_rng(6).uniform(-1, 1, (300, 3)).astype(np.float32))
    with torch.no_grad():
        for rows in (1, 7, 300):
            torch.testing.assert_close(traced(obs[:rows]), module(obs[:rows]))


@pytest.mark.parametrize("use_sde", [False, True])
def test_sac_actor_mu_and_log_std_layers_are_sb3s(use_sde):
    """SB3's SAC ``actor.mu`` (and, without gSDE, ``actor.log_std``) are layers with a weight and a bias: covey's
    are the same values as SB3's model of the same weights, views of covey's one head layer, so SB3 users'
    ``nn.init`` of the mean layer reaches the actor. With gSDE ``actor.log_std`` is the exploration matrix."""
    model = SAC("MlpPolicy", "Pendulum-v1", use_sde=use_sde, learning_starts=10, seed=0).learn(20)
    theirs = model.to_sb3_model()
    their_mu = theirs.actor.mu[0] if use_sde else theirs.actor.mu  # with gSDE, SB3's: Linear then Hardtanh
    for name in ("weight", "bias"):
        torch.testing.assert_close(getattr(model.actor.mu, name), getattr(their_mu, name))
    obs = torch.as_tensor(np.random.default_rng(6).uniform(-8, 8, (5, 3)).astype(np.float32))
    if use_sde:
        torch.testing.assert_close(model.actor.log_std.detach(), theirs.actor.log_std.detach())
    else:
        for name in ("weight", "bias"):
            torch.testing.assert_close(getattr(model.actor.log_std, name), getattr(theirs.actor.log_std, name))
        with torch.no_grad():
            latent = model.actor.latent_pi(obs)
            torch.testing.assert_close(model.actor.log_std(latent), theirs.actor.log_std(latent))
    with torch.no_grad():
        torch.nn.init.zeros_(model.actor.mu.weight)
        torch.nn.init.constant_(model.actor.mu.bias, 0.5)
        mean = model.actor.get_action_dist_params(obs)[0]
    torch.testing.assert_close(mean, torch.full_like(mean, 0.5))


@pytest.mark.parametrize("policy", ["MlpPolicy", "CnnPolicy"])
def test_sac_actor_and_critic_extract_features_as_sb3s(policy):
    """SB3's ``actor.extract_features(obs, actor.features_extractor)`` (and the critic's) give the features SB3's
    model of the same weights gives, from the observations as SB3's policy takes them (pixels unscaled)."""
    space = BOX_OBS if policy == "MlpPolicy" else image_space((3, 36, 36))
    model = SAC(policy, SpaceEnv(space, ACTION_SPACES["box"]), buffer_size=100, seed=0)
    theirs = model.to_sb3_model()
    raw = np.stack([space.sample() for _ in range(4)])
    ours_obs, their_obs = model.policy.obs_to_tensor(raw)[0], theirs.policy.obs_to_tensor(raw)[0]
    with torch.no_grad():
        for name in ("actor", "critic"):
            net, their_net = getattr(model, name), getattr(theirs, name)
            features = net.extract_features(ours_obs, net.features_extractor)
            torch.testing.assert_close(features, their_net.extract_features(their_obs, their_net.features_extractor))
            assert features.shape == (4, net.features_dim)


def test_sb3_policy_save_and_load_recipe(tmp_path):
    """SB3's "save the policy independently from the model" example with covey's names: policy.save, then
    MlpPolicy.load gives a policy that predicts as the trained one and scores the same in evaluate_policy."""
    from stable_baselines3.common.evaluation import evaluate_policy

    from covey import ppo, sac, serialization

    cases = (
        (ppo, ppo_model(ACTION_SPACES["box"]), lambda: SpaceEnv(BOX_OBS, ACTION_SPACES["box"])),
        (sac, sac_model(), "Pendulum-v1"),
    )
    for module, model, env_id in cases:
        path = tmp_path / module.__name__
        model.policy.save(path)
        saved = module.MlpPolicy.load(path)
        assert type(saved) is type(model.policy) and saved.actor is not model.actor
        obs = obs_batch().numpy()
        for deterministic in (True, False):
            torch.manual_seed(0)
            expected = model.policy.predict(obs, deterministic=deterministic)[0]
            torch.manual_seed(0)
            np.testing.assert_array_equal(saved.predict(obs, deterministic=deterministic)[0], expected)
        returns = []
        for policy in (model.policy, saved):
            env = make_vec_env(env_id, n_envs=1, seed=3)
            returns.append(evaluate_policy(policy, env, n_eval_episodes=2, deterministic=True)[0])
        assert returns[0] == returns[1]
        # The file is a model file of the networks only (no optimizer states): the agent's load reads it too.
        _, tensors = serialization.load_model_file(path, "cpu")
        groups = model._parameter_groups()
        assert set(tensors) == {name for name, g in groups.items() if not isinstance(g, torch.optim.Optimizer)}
        assert "policy" in tensors and type(model).load(path).num_timesteps == model.num_timesteps


@pytest.mark.cpu
def test_policy_load_names_the_right_class_and_copies_save_as_their_own(tmp_path):
    import copy
    import pickle

    from covey import ppo, sac, serialization

    model = ppo_model(ACTION_SPACES["discrete"])
    model.policy.save(tmp_path / "p")
    assert (tmp_path / "p.zip").exists()  # SB3's suffix rule for model files
    with pytest.raises(serialization.ModelFileError, match=r"holds a PPO model.*covey\.ppo\.MlpPolicy\.load"):
        sac.MlpPolicy.load(tmp_path / "p")
    assert isinstance(ppo.CnnPolicy.load(tmp_path / "p"), ActorCriticPolicy)  # the file says which networks
    # A copy or a pickle is the policy of a copy of the model (without its env), as SB3's "keep the best policy"
    # recipe takes it: it saves, and the file loads a policy that predicts as the original did when copied.
    obs = obs_batch()
    expected = model.actor.distribution_params(obs).detach().clone()
    for i, other in enumerate((copy.deepcopy(model.policy), pickle.loads(pickle.dumps(model.policy)))):
        torch.testing.assert_close(other.actor.distribution_params(obs), expected)
        assert other is not model.policy and other._model is not model and other._model.env is None
        other.save(tmp_path / f"copy{i}")
        torch.testing.assert_close(ppo.MlpPolicy.load(tmp_path / f"copy{i}").actor.distribution_params(obs), expected)
    with torch.no_grad():  # the copies have weights of their own
        next(model.actor.parameters()).add_(1.0)
    torch.testing.assert_close(other.actor.distribution_params(obs), expected)


def _linear_schedule(initial_value):  # the nested function of SB3's docs, which pickle cannot take
    def func(progress_remaining):
        return progress_remaining * initial_value

    return func


@pytest.mark.parametrize("agent", ["PPO", "SAC"])
def test_policy_pickles_whatever_the_learning_rate_schedule(agent):
    """pickle and torch.save take SB3's policy with any learning_rate (it holds no schedule); covey's policy
    pickles its model's settings, so a schedule pickle cannot take stays behind: the copy predicts as the
    original, trains at the file's value of the schedule and says so at its first learn."""
    import io
    import pickle

    if agent == "PPO":  # with a clip_range schedule that pickle takes, which travels with the copy
        model = PPO("MlpPolicy", "CartPole-v1", learning_rate=_linear_schedule(3e-4), **FAST)
        model.clip_range = _picklable_schedule
    else:
        model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=_linear_schedule(3e-4), learning_starts=8, seed=0)
    obs = model.observation_space.sample()[None]
    expected = model.policy.predict(obs, deterministic=True)[0]
    copies = [pickle.loads(pickle.dumps(model.policy))]
    file = io.BytesIO()
    torch.save(model.policy, file)
    file.seek(0)
    copies.append(torch.load(file, weights_only=False))
    for other in copies:
        np.testing.assert_array_equal(other.predict(obs, deterministic=True)[0], expected)
        assert other._model.config.learning_rate == pytest.approx(3e-4)  # the file's value, a number
        if agent == "PPO":
            assert other._model.config.clip_range is _picklable_schedule
    copy_model = copies[0]._model
    copy_model.set_env(make_vec_env("CartPole-v1" if agent == "PPO" else "Pendulum-v1", n_envs=1, seed=0))
    with pytest.warns(UserWarning, match="schedules that are functions") as record:
        copy_model.learn(32)
    told = [str(w.message) for w in record if "schedules that are functions" in str(w.message)]
    assert "learning_rate=0.0003, constant" in told[0] and "clip_range" not in told[0]


def _picklable_schedule(progress_remaining):
    return 0.1 + 0.1 * progress_remaining


def test_sb3_policy_classes_pick_the_networks():
    """SB3 scripts pass policy classes: stable_baselines3.sac.MlpPolicy is SACPolicy; covey's own aliases."""
    from stable_baselines3.ppo import CnnPolicy as SB3PPOCnn
    from stable_baselines3.sac import MlpPolicy as SB3SACMlp

    from covey import ppo, sac

    pendulum = dict(learning_starts=16, batch_size=16, seed=0)
    assert SAC(SB3SACMlp, "Pendulum-v1", **pendulum).policy_name == "MlpPolicy"
    assert SAC(sac.MlpPolicy, "Pendulum-v1", **pendulum).policy_name == "MlpPolicy"
    assert PPO(ppo.MlpPolicy, "CartPole-v1", **FAST).policy_name == "MlpPolicy"
    assert PPO(ppo.MultiInputPolicy, "CartPole-v1", **FAST).policy_name == "MultiInputPolicy"
    assert SB3PPOCnn.__name__ == "ActorCriticCnnPolicy" and ppo.CnnPolicy.__name__ == "CnnPolicy"


FLOAT_IMAGES = spaces.Dict({"frame": spaces.Box(0, 1, (3, 40, 40), np.float32), "pos": spaces.Box(-1, 1, (2,))})


def _weights(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(
    "policy, policy_kwargs",
    [
        ("MultiInputPolicy", dict(normalize_images=False)),
        ("MultiInputPolicy", dict(features_extractor_kwargs=dict(normalized_image=True))),
        ("MlpPolicy", dict(normalize_images=False, features_extractor_class="NatureCNN")),
        ("MultiInputPolicy", dict(normalize_images=False, features_extractor_class="CombinedExtractor")),
    ],
    ids=["normalize_images=False", "normalized_image", "SB3 NatureCNN", "SB3 CombinedExtractor"],
)
def test_float_images_are_images_where_sb3_takes_them_as_already_normalized(policy, policy_kwargs):
    """SB3 encodes any 3-D Box as an image with normalize_images=False (giving its NatureCNN and CombinedExtractor
    normalized_image=True) or with normalized_image=True: the same encoder, where covey flattened the key (or
    its NatureCNN refused the space)."""
    import stable_baselines3
    from stable_baselines3.common import torch_layers

    space = FLOAT_IMAGES if policy == "MultiInputPolicy" else FLOAT_IMAGES["frame"]
    kwargs = dict(policy_kwargs)
    if isinstance(kwargs.get("features_extractor_class"), str):
        kwargs["features_extractor_class"] = getattr(torch_layers, kwargs["features_extractor_class"])
    env = SpaceEnv(space, spaces.Discrete(2))
    ours = PPO(policy, env, n_steps=16, batch_size=16, policy_kwargs=kwargs)
    theirs = stable_baselines3.PPO(policy, env, n_steps=16, batch_size=16, policy_kwargs=dict(kwargs))
    sb3_extractor = theirs.policy.features_extractor
    assert ours.actor.encoder.out_dim == sb3_extractor.features_dim
    assert _weights(ours.actor.encoder) == _weights(sb3_extractor) > 10_000  # convolutions, not a flattening
    ours.learn(16)


def test_only_a_gaussian_policy_has_a_log_std_as_in_sb3():
    """``hasattr(model.policy, "log_std")`` tells Gaussian policies from others in SB3 (a callback logging the
    std across envs); covey's policy of Discrete actions has none either (it had one, None)."""
    import stable_baselines3

    for env in ("CartPole-v1", "Pendulum-v1"):
        ours, theirs = PPO("MlpPolicy", env), stable_baselines3.PPO("MlpPolicy", env)
        assert hasattr(ours.policy, "log_std") == hasattr(theirs.policy, "log_std") == (env == "Pendulum-v1")
    assert PPO("MlpPolicy", "Pendulum-v1").policy.log_std.shape == (1,)


def test_cnn_policy_without_an_image_is_refused_and_mlp_policy_on_dict_images_warns():
    """SB3 refuses both. covey's MlpPolicy flattens each Dict key, which fits vectors silently and warns of image
    keys, whose pixels it would feed to the MLP; CnnPolicy on a Discrete observation would build an MLP."""
    image = spaces.Box(0, 255, (36, 36, 3), np.uint8)
    with pytest.raises(ValueError, match=r"CnnPolicy puts a NatureCNN on image observations, and Discrete\(3\)"):
        PPO("CnnPolicy", SpaceEnv(spaces.Discrete(3), spaces.Discrete(2)))
    with pytest.raises(ValueError, match=r"MultiBinary\(4\) holds no image: use MlpPolicy"):
        SAC("CnnPolicy", SpaceEnv(spaces.MultiBinary(4), spaces.Box(-1, 1, (1,))))
    with pytest.warns(UserWarning, match=r"MlpPolicy flattens the image key\(s\) \['frame'\].*MultiInputPolicy"):
        PPO("MlpPolicy", SpaceEnv(spaces.Dict({"frame": image, "pos": spaces.Box(-1, 1, (2,))}), spaces.Discrete(2)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PPO("MlpPolicy", SpaceEnv(spaces.Dict({"pos": spaces.Box(-1, 1, (2,))}), spaces.Discrete(2)))
        PPO("MultiInputPolicy", SpaceEnv(spaces.Dict({"frame": image}), spaces.Discrete(2)))

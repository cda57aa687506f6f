"""GAE against hand-computed numbers: every expected value below is worked out in the comments."""

import numpy as np
import pytest
import torch
from gymnasium import spaces

from covey.buffers.returns import gae
from covey.buffers.rollout import RolloutBuffer
from covey.networks.encoders import obs_dtype

GAMMA, LAM = 0.9, 0.8  # gamma * lambda = 0.72


def col(*xs):
    """A single-env column (T, 1)."""
    return np.array(xs, dtype=np.float64).reshape(-1, 1)


def flags(*xs):
    """A single-env boolean column (T, 1)."""
    return np.array(xs, dtype=bool).reshape(-1, 1)


def test_single_env_no_episode_end():
    """Three steps, no done: advantages accumulate with gamma * lambda = 0.72."""
    rewards, values, next_values = col(1, 2, 3), col(0.5, 1.0, 1.5), col(1.0, 1.5, 2.0)
    no = flags(0, 0, 0)
    adv, ret = gae(rewards, values, next_values, no, no, GAMMA, LAM)
    # delta0 = 1 + 0.9*1.0 - 0.5 = 1.4;  delta1 = 2 + 0.9*1.5 - 1.0 = 2.35;  delta2 = 3 + 0.9*2.0 - 1.5 = 3.3
    # A2 = 3.3;  A1 = 2.35 + 0.72*3.3 = 4.726;  A0 = 1.4 + 0.72*4.726 = 1.4 + 3.40272 = 4.80272
    np.testing.assert_allclose(adv[:, 0], [4.80272, 4.726, 3.3], rtol=1e-6)
    # returns = A + V = [4.80272 + 0.5, 4.726 + 1.0, 3.3 + 1.5]
    np.testing.assert_allclose(ret[:, 0], [5.30272, 5.726, 4.8], rtol=1e-6)


def test_terminal_cuts_bootstrap_and_accumulation():
    """A terminal at t=1 ignores next_values[1] and stops A2 flowing back into A1."""
    rewards, values, next_values = col(1, 2, 3), col(0.5, 1.0, 1.5), col(1.0, 5.0, 2.0)
    term = flags(0, 1, 0)
    adv, ret = gae(rewards, values, next_values, term, term, GAMMA, LAM)
    # delta0 = 1 + 0.9*1.0 - 0.5 = 1.4;  delta1 = 2 + 0 (5.0 ignored) - 1.0 = 1.0;  delta2 = 3.3
    # A2 = 3.3;  A1 = 1.0 (no A2 term);  A0 = 1.4 + 0.72*1.0 = 2.12
    np.testing.assert_allclose(adv[:, 0], [2.12, 1.0, 3.3], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], [2.62, 2.0, 4.8], rtol=1e-6)


def test_truncation_bootstraps_but_cuts_accumulation():
    """A truncation at t=1 bootstraps from next_values[1] = 4.0 (not values[2] = 1.5), but A2 stays out."""
    rewards, values, next_values = col(1, 2, 3), col(0.5, 1.0, 1.5), col(1.0, 4.0, 2.0)
    adv, ret = gae(rewards, values, next_values, flags(0, 0, 0), flags(0, 1, 0), GAMMA, LAM)
    # delta0 = 1.4;  delta1 = 2 + 0.9*4.0 - 1.0 = 4.6;  delta2 = 3.3
    # A2 = 3.3;  A1 = 4.6 (no A2 term);  A0 = 1.4 + 0.72*4.6 = 1.4 + 3.312 = 4.712
    np.testing.assert_allclose(adv[:, 0], [4.712, 4.6, 3.3], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], [5.212, 5.6, 4.8], rtol=1e-6)


def _three_envs():
    """(T=3, N=3): env 0 terminates at t=1, env 1 is truncated at t=1, env 2 runs on."""
    rewards = np.array([[1, 1, -1], [2, 2, 0.5], [3, 3, 2]], dtype=np.float64)
    values = np.array([[0.5, 0.5, 0.0], [1.0, 1.0, 0.5], [1.5, 1.5, 1.0]])
    next_values = np.array([[1.0, 1.0, 0.5], [5.0, 4.0, 1.0], [2.0, 2.0, 2.0]])
    terminated = np.array([[0, 0, 0], [1, 0, 0], [0, 0, 0]], dtype=bool)
    dones = np.array([[0, 0, 0], [1, 1, 0], [0, 0, 0]], dtype=bool)
    return rewards, values, next_values, terminated, dones


def test_several_envs_every_entry():
    """Each env keeps to its own column: a done in env 0 or 1 does not touch env 2."""
    adv, ret = gae(*_three_envs(), GAMMA, LAM)
    # env 0 = the terminal case above: A = [2.12, 1.0, 3.3]
    # env 1 = the truncation case above: A = [4.712, 4.6, 3.3]
    # env 2: delta0 = -1 + 0.9*0.5 - 0.0 = -0.55;  delta1 = 0.5 + 0.9*1.0 - 0.5 = 0.9
    #        delta2 = 2 + 0.9*2.0 - 1.0 = 2.8
    #        A2 = 2.8;  A1 = 0.9 + 0.72*2.8 = 2.916;  A0 = -0.55 + 0.72*2.916 = -0.55 + 2.09952 = 1.54952
    expected_adv = [[2.12, 4.712, 1.54952], [1.0, 4.6, 2.916], [3.3, 3.3, 2.8]]
    # returns = A + V
    expected_ret = [[2.62, 5.212, 1.54952], [2.0, 5.6, 3.416], [4.8, 4.8, 3.8]]
    np.testing.assert_allclose(adv, expected_adv, rtol=1e-6)
    np.testing.assert_allclose(ret, expected_ret, rtol=1e-6)


def test_several_envs_match_each_column_alone():
    """Running all envs at once equals running each column as a single env."""
    arrays = _three_envs()
    adv, ret = gae(*arrays, GAMMA, LAM)
    for e in range(3):
        adv_e, ret_e = gae(*(a[:, e : e + 1] for a in arrays), GAMMA, LAM)
        np.testing.assert_allclose(adv[:, e : e + 1], adv_e, rtol=1e-6)
        np.testing.assert_allclose(ret[:, e : e + 1], ret_e, rtol=1e-6)


def test_lambda_one_is_discounted_monte_carlo_plus_bootstrap():
    """lambda = 1, no done: returns are discounted reward sums plus gamma^k * V(last next state)."""
    rewards, values, next_values = col(1, 2, 3), col(0.5, 1.0, 1.5), col(1.0, 1.5, 2.0)
    no = flags(0, 0, 0)
    adv, ret = gae(rewards, values, next_values, no, no, GAMMA, 1.0)
    # G0 = 1 + 0.9*2 + 0.81*3 + 0.729*2.0 = 1 + 1.8 + 2.43 + 1.458 = 6.688
    # G1 = 2 + 0.9*3 + 0.81*2.0 = 2 + 2.7 + 1.62 = 6.32
    # G2 = 3 + 0.9*2.0 = 4.8
    np.testing.assert_allclose(ret[:, 0], [6.688, 6.32, 4.8], rtol=1e-6)
    # A = G - V = [6.688 - 0.5, 6.32 - 1.0, 4.8 - 1.5]
    np.testing.assert_allclose(adv[:, 0], [6.188, 5.32, 3.3], rtol=1e-6)


def test_lambda_zero_is_one_step_td():
    """lambda = 0: returns are r_t + gamma * V(s_{t+1}), advantages are the TD errors."""
    rewards, values, next_values = col(1, 2, 3), col(0.5, 1.0, 1.5), col(1.0, 1.5, 2.0)
    no = flags(0, 0, 0)
    adv, ret = gae(rewards, values, next_values, no, no, GAMMA, 0.0)
    # returns = [1 + 0.9*1.0, 2 + 0.9*1.5, 3 + 0.9*2.0]
    np.testing.assert_allclose(ret[:, 0], [1.9, 3.35, 4.8], rtol=1e-6)
    # A = returns - V = [1.9 - 0.5, 3.35 - 1.0, 4.8 - 1.5]
    np.testing.assert_allclose(adv[:, 0], [1.4, 2.35, 3.3], rtol=1e-6)


def _buffer(rewards, terminated, dones, values):
    """A RolloutBuffer(3 steps, 2 envs) filled with the given per-step rows and values."""
    buf = RolloutBuffer(n_steps=3, n_envs=2, observation_space=spaces.Box(-1, 1, (1,)), action_space=spaces.Discrete(2))
    for t in range(3):
        buf.add(
            torch.zeros(2, 1),
            torch.zeros(2, dtype=torch.long),
            np.array(rewards[t], dtype=np.float32),
            np.array(terminated[t], dtype=bool),
            np.array(dones[t], dtype=bool),
        )
    buf.values_tensor = torch.tensor(values, dtype=torch.float32)
    return buf


def test_rollout_buffer_compute_returns():
    """Terminal bootstraps 0, truncation bootstraps truncation_values, the last step last_values."""
    # env 0 terminates at t=0 (t=1, 2 are a new episode); env 1 is truncated at t=1.
    buf = _buffer(
        rewards=[[1, 0.5], [2, 1.0], [3, -1.0]],
        terminated=[[1, 0], [0, 0], [0, 0]],
        dones=[[1, 0], [0, 1], [0, 0]],
        values=[[0.5, 0.25], [1.0, 0.75], [1.5, 2.0]],
    )
    buf.truncation_values[1, 1] = 3.0  # V(true final obs) of env 1, differs from values[2, 1] = 2.0
    buf.compute_returns(last_values=np.array([2.0, 0.5]), gamma=GAMMA, gae_lambda=LAM)
    # env 0: delta0 = 1 + 0 (terminal; values[1, 0] = 1.0 NOT used) - 0.5 = 0.5
    #        delta1 = 2 + 0.9*1.5 - 1.0 = 2.35;  delta2 = 3 + 0.9*2.0 (last_values[0]) - 1.5 = 3.3
    #        A2 = 3.3;  A1 = 2.35 + 0.72*3.3 = 4.726;  A0 = 0.5 (cut at the terminal)
    # env 1: delta0 = 0.5 + 0.9*0.75 - 0.25 = 0.925
    #        delta1 = 1 + 0.9*3.0 (truncation value, not values[2, 1] = 2.0) - 0.75 = 2.95
    #        delta2 = -1 + 0.9*0.5 (last_values[1]) - 2.0 = -2.55
    #        A2 = -2.55;  A1 = 2.95 (cut at the truncation);  A0 = 0.925 + 0.72*2.95 = 0.925 + 2.124 = 3.049
    expected_adv = [[0.5, 3.049], [4.726, 2.95], [3.3, -2.55]]
    # returns = A + V
    expected_ret = [[1.0, 3.299], [5.726, 3.7], [4.8, -0.55]]
    np.testing.assert_allclose(buf.advantages, expected_adv, rtol=1e-6)
    np.testing.assert_allclose(buf.returns, expected_ret, rtol=1e-6)


def test_rollout_buffer_done_on_last_step_ignores_last_values():
    """At the last step, a terminal bootstraps 0 and a truncation truncation_values, never last_values."""
    # env 0 terminates at t=2, env 1 is truncated at t=2; last_values (from reset obs) must be ignored.
    buf = _buffer(
        rewards=[[1, 1], [2, 2], [3, 3]],
        terminated=[[0, 0], [0, 0], [1, 0]],
        dones=[[0, 0], [0, 0], [1, 1]],
        values=[[0.5, 0.5], [1.0, 1.0], [1.5, 1.5]],
    )
    buf.truncation_values[2, 1] = 4.0
    buf.compute_returns(last_values=np.array([10.0, 10.0]), gamma=GAMMA, gae_lambda=LAM)
    # shared: delta0 = 1 + 0.9*1.0 - 0.5 = 1.4;  delta1 = 2 + 0.9*1.5 - 1.0 = 2.35
    # env 0: delta2 = 3 + 0 (terminal) - 1.5 = 1.5;  A1 = 2.35 + 0.72*1.5 = 3.43
    #        A0 = 1.4 + 0.72*3.43 = 1.4 + 2.4696 = 3.8696
    # env 1: delta2 = 3 + 0.9*4.0 (truncation value) - 1.5 = 5.1;  A1 = 2.35 + 0.72*5.1 = 6.022
    #        A0 = 1.4 + 0.72*6.022 = 1.4 + 4.33584 = 5.73584
    # returns = A + V
    expected_adv = [[3.8696, 5.73584], [3.43, 6.022], [1.5, 5.1]]
    expected_ret = [[4.3696, 6.23584], [4.43, 7.022], [3.0, 6.6]]
    np.testing.assert_allclose(buf.advantages, expected_adv, rtol=1e-6)
    np.testing.assert_allclose(buf.returns, expected_ret, rtol=1e-6)


@pytest.mark.parametrize(
    "obs_space, action_space",
    [
        (spaces.Box(-1, 1, (3,)), spaces.Discrete(4)),
        (spaces.Box(-1, 1, (2, 2)), spaces.Box(-1, 1, (2,))),
        (spaces.MultiBinary(3), spaces.MultiDiscrete([2, 3])),
    ],
)
def test_rollout_buffer_stores_numpy_arrays_as_it_stores_tensors(obs_space, action_space):
    # A step's NumPy arrays go straight into NumPy views of the CPU buffer; the stored values and dtypes are
    # what the tensors PyTorch makes of the same arrays store (float64 observations rounded to float32, ...).
    rng = np.random.default_rng(0)
    n_steps, n_envs = 3, 2
    buffers = [RolloutBuffer(n_steps, n_envs, obs_space, action_space) for _ in range(2)]
    dtype = obs_dtype(obs_space)
    for _ in range(n_steps):
        obs = (
            rng.normal(size=(n_envs, *obs_space.shape))
            if isinstance(obs_space, spaces.Box)
            else rng.integers(0, 2, size=(n_envs, *obs_space.shape), dtype=np.int8)
        )
        actions = np.stack([action_space.sample() for _ in range(n_envs)])
        rewards, dones = rng.normal(size=n_envs).astype(np.float32), rng.random(n_envs) < 0.5
        buffers[0].add(obs, actions, rewards, dones.copy(), dones)
        buffers[1].add(torch.as_tensor(obs, dtype=dtype), torch.as_tensor(actions), rewards, dones.copy(), dones)
    numpy_filled, tensor_filled = buffers
    assert numpy_filled.pos == tensor_filled.pos == n_steps
    assert numpy_filled.observations_tensor.dtype == tensor_filled.observations_tensor.dtype == dtype
    assert torch.equal(numpy_filled.observations_tensor, tensor_filled.observations_tensor)
    assert numpy_filled.actions_tensor.dtype == tensor_filled.actions_tensor.dtype
    assert torch.equal(numpy_filled.actions_tensor, tensor_filled.actions_tensor)
    assert torch.equal(numpy_filled.flat_observations(), tensor_filled.flat_observations())
    assert numpy_filled.observations_tensor.abs().sum() > 0  # something was stored


def test_episode_starts_follow_the_dones_of_the_step_before_even_from_one_array_refilled_in_place():
    """SB3's add without episode_starts: a step starts an episode where the step before ended one."""
    buf = RolloutBuffer(n_steps=3, n_envs=3, observation_space=spaces.Box(-1, 1, (1,)), action_space=spaces.Discrete(2))
    dones = np.zeros(3, dtype=bool)  # one array, as a collector may refill it every step
    for row in ([True, False, False], [False, True, False], [False, False, False]):
        dones[:] = row
        buf.add(torch.zeros(3, 1), torch.zeros(3, dtype=torch.long), np.zeros(3, np.float32), dones, dones)
    np.testing.assert_array_equal(buf.episode_starts, [[1, 1, 1], [1, 0, 0], [0, 1, 0]])

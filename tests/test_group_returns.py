"""MA-POCA group lambda-returns against hand-computed numbers (arithmetic in the comments).

Shapes: rewards / ended / bootstrap (T, N, S); values (T, N); last_values (N,).
Every expected value is a literal worked out by hand, never a re-implementation of the recursion.
"""

import numpy as np

from covey.buffers.returns import group_lambda_returns

GAMMA, LAM = 0.9, 0.8


def one_agent(*xs):
    """A single env, single agent column (T, 1, 1)."""
    return np.array(xs, dtype=np.float64).reshape(-1, 1, 1)


def one_env_values(*xs):
    """A single env value column (T, 1)."""
    return np.array(xs, dtype=np.float64).reshape(-1, 1)


def no_end(t, n=1, s=1):
    return np.zeros((t, n, s), dtype=bool)


def zeros(t, n=1, s=1):
    return np.zeros((t, n, s), dtype=np.float64)


# --- 1. one env, one agent, no end -------------------------------------------------------------


def test_single_agent_no_end():
    """values [1, 2, 3], last 4, rewards [1, 0, 2], gamma 0.9, lam 0.8."""
    rewards = one_agent(1, 0, 2)
    values = one_env_values(1.0, 2.0, 3.0)
    last = np.array([4.0])
    ret = group_lambda_returns(rewards, values, last, no_end(3), zeros(3), GAMMA, LAM)
    assert ret.shape == (3, 1, 1)
    # G3 = last = 4, V3 = last = 4
    # G2 = 2 + 0.9 * (0.8*4 + 0.2*4) = 2 + 0.9*4 = 5.6
    # G1 = 0 + 0.9 * (0.8*5.6 + 0.2*3) = 0.9 * (4.48 + 0.6) = 0.9 * 5.08 = 4.572
    # G0 = 1 + 0.9 * (0.8*4.572 + 0.2*2) = 1 + 0.9 * (3.6576 + 0.4) = 1 + 0.9*4.0576 = 1 + 3.65184 = 4.65184
    np.testing.assert_allclose(ret[:, 0, 0], [4.65184, 4.572, 5.6], rtol=1e-6)


# --- 2. the two extremes of lambda -------------------------------------------------------------


def test_lambda_one_is_discounted_monte_carlo_plus_last_value():
    rewards = one_agent(1, 0, 2)
    values = one_env_values(1.0, 2.0, 3.0)
    last = np.array([4.0])
    ret = group_lambda_returns(rewards, values, last, no_end(3), zeros(3), GAMMA, 1.0)
    # G2 = 2 + 0.9*4 = 5.6
    # G1 = 0 + 0.9*2 + 0.81*4 = 1.8 + 3.24 = 5.04
    # G0 = 1 + 0.9*0 + 0.81*2 + 0.729*4 = 1 + 1.62 + 2.916 = 5.536
    # (the intermediate values 1, 2, 3 play no role)
    np.testing.assert_allclose(ret[:, 0, 0], [5.536, 5.04, 5.6], rtol=1e-6)


def test_lambda_zero_is_one_step_td_target():
    rewards = one_agent(1, 0, 2)
    values = one_env_values(1.0, 2.0, 3.0)
    last = np.array([4.0])
    ret = group_lambda_returns(rewards, values, last, no_end(3), zeros(3), GAMMA, 0.0)
    # G0 = 1 + 0.9*V1 = 1 + 0.9*2 = 2.8
    # G1 = 0 + 0.9*V2 = 0.9*3 = 2.7
    # G2 = 2 + 0.9*last = 2 + 3.6 = 5.6
    np.testing.assert_allclose(ret[:, 0, 0], [2.8, 2.7, 5.6], rtol=1e-6)


# --- 3. an agent leaving early: posthumous credit ----------------------------------------------


def _early_leaver(bootstrap_value):
    """N=1, S=2, T=3. Agent 0 leaves at t=0; agent 1 stays to the end of the rollout."""
    rewards = np.zeros((3, 1, 2))
    rewards[:, 0, 0] = [1.0, 0.0, 0.0]  # agent 0: only t=0 is real (absent afterwards)
    rewards[:, 0, 1] = [0.0, 1.0, 2.0]  # agent 1
    ended = np.zeros((3, 1, 2), dtype=bool)
    ended[0, 0, 0] = True
    bootstrap = np.zeros((3, 1, 2))
    bootstrap[0, 0, 0] = bootstrap_value  # V of the group state that continues without agent 0
    values = one_env_values(1.0, 2.0, 3.0)
    last = np.array([4.0])
    return group_lambda_returns(rewards, values, last, ended, bootstrap, GAMMA, LAM)


def test_early_leaver_gets_posthumous_credit():
    ret = _early_leaver(5.0)
    # agent 0 at t=0: ended, G = r + gamma * V_cont = 1 + 0.9*5 = 5.5 (not just r = 1)
    np.testing.assert_allclose(ret[0, 0, 0], 5.5, rtol=1e-6)
    # agent 1 follows the continuing recursion with values [1, 2, 3], last 4, rewards [0, 1, 2]:
    # G2 = 2 + 0.9*4 = 5.6
    # G1 = 1 + 0.9 * (0.8*5.6 + 0.2*3) = 1 + 0.9*5.08 = 1 + 4.572 = 5.572
    # G0 = 0 + 0.9 * (0.8*5.572 + 0.2*2) = 0.9 * (4.4576 + 0.4) = 0.9*4.8576 = 4.37184
    np.testing.assert_allclose(ret[:, 0, 1], [4.37184, 5.572, 5.6], rtol=1e-6)


def test_early_leaver_with_zero_bootstrap_loses_the_credit():
    """What zero-filling the leaver's bootstrap would do: the return collapses to its last reward."""
    ret = _early_leaver(0.0)
    # agent 0 at t=0: G = 1 + 0.9*0 = 1.0  (vs 5.5 with posthumous credit)
    np.testing.assert_allclose(ret[0, 0, 0], 1.0, rtol=1e-6)
    # agent 1 is unaffected by agent 0's bootstrap: same numbers as above
    np.testing.assert_allclose(ret[:, 0, 1], [4.37184, 5.572, 5.6], rtol=1e-6)


def test_early_leaver_follows_the_groups_return_on_while_the_group_continues():
    """Given which agents are present and where the group goes on, a leaver's return continues with its
    groupmates' (lambda-weighted), so team rewards after it left reach it even where the value misses them."""
    rewards = np.zeros((3, 1, 2))
    rewards[:, 0, 0] = [1.0, 0.0, 0.0]
    rewards[:, 0, 1] = [0.0, 1.0, 2.0]
    ended = np.zeros((3, 1, 2), dtype=bool)
    ended[0, 0, 0] = True
    bootstrap = np.zeros((3, 1, 2))
    bootstrap[0, 0, 0] = 5.0
    present = np.zeros((3, 1, 2), dtype=bool)
    present[0, 0, :] = True
    present[1:, 0, 1] = True
    continues = np.ones((3, 1), dtype=bool)
    values, last = one_env_values(1.0, 2.0, 3.0), np.array([4.0])
    ret = group_lambda_returns(rewards, values, last, ended, bootstrap, GAMMA, LAM, present, continues)
    # agent 1 as in test_early_leaver_gets_posthumous_credit: [4.37184, 5.572, 5.6]
    np.testing.assert_allclose(ret[:, 0, 1], [4.37184, 5.572, 5.6], rtol=1e-6)
    # agent 0: 1 + 0.9 * (0.8 * G1 of agent 1 + 0.2 * V_cont) = 1 + 0.9 * (0.8 * 5.572 + 0.2 * 5)
    #        = 1 + 0.9 * (4.4576 + 1.0) = 1 + 4.91184 = 5.91184
    np.testing.assert_allclose(ret[0, 0, 0], 5.91184, rtol=1e-6)
    # lambda = 0 is the bootstrap alone: 1 + 0.9 * 5 = 5.5
    ret0 = group_lambda_returns(rewards, values, last, ended, bootstrap, GAMMA, 0.0, present, continues)
    np.testing.assert_allclose(ret0[0, 0, 0], 5.5, rtol=1e-6)


def test_a_leaver_takes_the_mean_return_of_the_agents_present_after_it():
    """N=1, S=3, T=2: agent 0 leaves at t=0; agents 1 and 2 stay; values [1, 2], last 4."""
    rewards = np.zeros((2, 1, 3))
    rewards[:, 0, 0] = [1.0, 0.0]
    rewards[:, 0, 1] = [0.0, 1.0]
    rewards[:, 0, 2] = [0.0, 3.0]
    ended = np.zeros((2, 1, 3), dtype=bool)
    ended[0, 0, 0] = True
    bootstrap = np.zeros((2, 1, 3))
    bootstrap[0, 0, 0] = 5.0
    present = np.ones((2, 1, 3), dtype=bool)
    present[1, 0, 0] = False
    continues = np.ones((2, 1), dtype=bool)
    ret = group_lambda_returns(
        rewards, one_env_values(1.0, 2.0), np.array([4.0]), ended, bootstrap, GAMMA, LAM, present, continues
    )
    # at t=1: agent 1 = 1 + 0.9 * 4 = 4.6, agent 2 = 3 + 0.9 * 4 = 6.6; their mean 5.6
    np.testing.assert_allclose(ret[1, 0, 1:], [4.6, 6.6], rtol=1e-6)
    # agent 0: 1 + 0.9 * (0.8 * 5.6 + 0.2 * 5) = 1 + 0.9 * 5.48 = 5.932
    np.testing.assert_allclose(ret[0, 0, 0], 5.932, rtol=1e-6)


def test_a_leaver_on_the_rollouts_last_step_follows_the_last_value():
    """T=2: agent 0 leaves at t=1, the last step, while agent 1 stays: the group's return after it is last_values."""
    rewards = np.zeros((2, 1, 2))
    rewards[1, 0, 0] = 2.0
    ended = np.zeros((2, 1, 2), dtype=bool)
    ended[1, 0, 0] = True
    bootstrap = np.zeros((2, 1, 2))
    bootstrap[1, 0, 0] = 5.0
    present = np.ones((2, 1, 2), dtype=bool)
    continues = np.ones((2, 1), dtype=bool)
    ret = group_lambda_returns(
        rewards, one_env_values(1.0, 2.0), np.array([4.0]), ended, bootstrap, GAMMA, LAM, present, continues
    )
    # 2 + 0.9 * (0.8 * 4 + 0.2 * 5) = 2 + 0.9 * 4.2 = 5.78
    np.testing.assert_allclose(ret[1, 0, 0], 5.78, rtol=1e-6)


def test_where_the_group_ends_a_leaver_keeps_its_bootstrap_alone():
    """continues false (the whole group ended at t=0: a truncation bootstraps from the final state's value 5):
    nothing after the step is the group's, so the return is r + gamma * bootstrap, whatever follows."""
    rewards = np.zeros((2, 1, 2))
    rewards[0, 0, :] = 1.0
    rewards[1, 0, :] = 100.0  # the next episode's
    ended = np.zeros((2, 1, 2), dtype=bool)
    ended[0, 0, :] = True
    bootstrap = np.zeros((2, 1, 2))
    bootstrap[0, 0, :] = 5.0
    present = np.ones((2, 1, 2), dtype=bool)
    continues = np.array([[False], [True]])
    ret = group_lambda_returns(
        rewards, one_env_values(1.0, 2.0), np.array([4.0]), ended, bootstrap, GAMMA, LAM, present, continues
    )
    np.testing.assert_allclose(ret[0, 0, :], [5.5, 5.5], rtol=1e-6)  # 1 + 0.9 * 5


# --- 4. a group terminal in the middle of the rollout ------------------------------------------


def _terminal_mid_rollout(values_after, last, rewards_after):
    """N=1, S=2, T=4. Episode 1 = t 0..1, group terminal at t=1 (all ended, bootstrap 0); episode 2 = t 2..3."""
    rewards = np.zeros((4, 1, 2))
    rewards[:2, 0, 0] = [1.0, 2.0]
    rewards[:2, 0, 1] = [0.0, 1.0]
    rewards[2:, 0, :] = rewards_after
    ended = np.zeros((4, 1, 2), dtype=bool)
    ended[1, 0, :] = True
    values = one_env_values(1.0, 2.0, *values_after)
    return group_lambda_returns(rewards, values, np.array([last]), ended, zeros(4, 1, 2), GAMMA, LAM)


def test_group_terminal_mid_rollout():
    ret = _terminal_mid_rollout(values_after=(100.0, 200.0), last=300.0, rewards_after=[[3.0, 0.0], [4.0, 1.0]])
    # Episode 2 (values 100, 200, last 300):
    # agent 0: G3 = 4 + 0.9*300 = 274;  G2 = 3 + 0.9*(0.8*274 + 0.2*200) = 3 + 0.9*(219.2 + 40) = 3 + 233.28 = 236.28
    # agent 1: G3 = 1 + 270 = 271;      G2 = 0 + 0.9*(0.8*271 + 40) = 0.9*(216.8 + 40) = 231.12
    # Episode 1 (terminal at t=1, bootstrap 0):
    # agent 0: G1 = 2 + 0 = 2;  G0 = 1 + 0.9*(0.8*2 + 0.2*V1=2) = 1 + 0.9*2.0 = 2.8
    # agent 1: G1 = 1 + 0 = 1;  G0 = 0 + 0.9*(0.8*1 + 0.2*2) = 0.9*1.2 = 1.08
    np.testing.assert_allclose(ret[:, 0, 0], [2.8, 2.0, 236.28, 274.0], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0, 1], [1.08, 1.0, 231.12, 271.0], rtol=1e-6)


def test_group_terminal_isolates_the_previous_episode():
    """Changing everything after the boundary leaves the returns before it unchanged."""
    ret = _terminal_mid_rollout(values_after=(-50.0, 7.0), last=-9.0, rewards_after=[[-3.0, 11.0], [0.5, -2.0]])
    np.testing.assert_allclose(ret[:2, 0, 0], [2.8, 2.0], rtol=1e-6)
    np.testing.assert_allclose(ret[:2, 0, 1], [1.08, 1.0], rtol=1e-6)


# --- 5. truncation ------------------------------------------------------------------------------


def test_truncation_mid_rollout_bootstraps_from_final_state():
    """T=3: episode truncated at t=1 with V(final state) = 6; a new episode starts at t=2."""
    rewards = one_agent(1, 1, 1)
    values = one_env_values(1.0, 2.0, 10.0)  # values[2] = 10 is the *new* episode's first state
    ended = no_end(3)
    ended[1, 0, 0] = True
    bootstrap = zeros(3)
    bootstrap[1, 0, 0] = 6.0
    ret = group_lambda_returns(rewards, values, np.array([20.0]), ended, bootstrap, GAMMA, LAM)
    # G2 = 1 + 0.9*20 = 19
    # G1 = 1 + 0.9*6 = 6.4  (not 1 + 0.9*10: the reset state's value does not leak in)
    # G0 = 1 + 0.9*(0.8*6.4 + 0.2*2) = 1 + 0.9*(5.12 + 0.4) = 1 + 0.9*5.52 = 1 + 4.968 = 5.968
    np.testing.assert_allclose(ret[:, 0, 0], [5.968, 6.4, 19.0], rtol=1e-6)

    # The same rollout with a true terminal (bootstrap 0) instead:
    # G1 = 1;  G0 = 1 + 0.9*(0.8*1 + 0.2*2) = 1 + 0.9*1.2 = 2.08
    ret0 = group_lambda_returns(rewards, values, np.array([20.0]), ended, zeros(3), GAMMA, LAM)
    np.testing.assert_allclose(ret0[:, 0, 0], [2.08, 1.0, 19.0], rtol=1e-6)


def test_truncation_on_last_step_uses_bootstrap_not_last_values():
    """T=2: truncation at the rollout's last step; last_values (50) is the reset state's value and is ignored."""
    rewards = one_agent(1, 1)
    values = one_env_values(1.0, 2.0)
    ended = no_end(2)
    ended[1, 0, 0] = True
    bootstrap = zeros(2)
    bootstrap[1, 0, 0] = 6.0
    ret = group_lambda_returns(rewards, values, np.array([50.0]), ended, bootstrap, GAMMA, LAM)
    # G1 = 1 + 0.9*6 = 6.4;  G0 = 1 + 0.9*(0.8*6.4 + 0.2*2) = 5.968
    np.testing.assert_allclose(ret[:, 0, 0], [5.968, 6.4], rtol=1e-6)


# --- 6. several envs at once --------------------------------------------------------------------


def test_two_envs_match_running_each_alone():
    """N=2, S=2, T=3. env 0: agent 0 leaves at t=0 (credit 5.0); env 1: group terminal at t=1, then a new episode."""
    rewards = np.zeros((3, 2, 2))
    rewards[:, 0, 0] = [1.0, 0.0, 0.0]
    rewards[:, 0, 1] = [0.0, 1.0, 2.0]
    rewards[:, 1, 0] = [1.0, 1.0, 1.0]
    rewards[:, 1, 1] = [0.0, 2.0, 1.0]
    ended = np.zeros((3, 2, 2), dtype=bool)
    ended[0, 0, 0] = True
    ended[1, 1, :] = True
    bootstrap = np.zeros((3, 2, 2))
    bootstrap[0, 0, 0] = 5.0
    values = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 10.0]])
    last = np.array([4.0, 20.0])
    ret = group_lambda_returns(rewards, values, last, ended, bootstrap, GAMMA, LAM)
    assert ret.shape == (3, 2, 2)

    # env 0 = the early-leaver case above: agent 0 G0 = 1 + 0.9*5 = 5.5; agent 1 [4.37184, 5.572, 5.6]
    np.testing.assert_allclose(ret[0, 0, 0], 5.5, rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0, 1], [4.37184, 5.572, 5.6], rtol=1e-6)
    # env 1 (values 1, 2, 10, last 20; terminal at t=1):
    # agent 0: G2 = 1 + 0.9*20 = 19;  G1 = 1;  G0 = 1 + 0.9*(0.8*1 + 0.2*2) = 1 + 1.08 = 2.08
    # agent 1: G2 = 1 + 18 = 19;      G1 = 2;  G0 = 0 + 0.9*(0.8*2 + 0.2*2) = 0.9*2.0 = 1.8
    np.testing.assert_allclose(ret[:, 1, 0], [2.08, 1.0, 19.0], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 1, 1], [1.8, 2.0, 19.0], rtol=1e-6)

    # Each env's slice equals the function run on that env alone.
    for n in range(2):
        alone = group_lambda_returns(
            rewards[:, n : n + 1],
            values[:, n : n + 1],
            last[n : n + 1],
            ended[:, n : n + 1],
            bootstrap[:, n : n + 1],
            GAMMA,
            LAM,
        )
        np.testing.assert_allclose(ret[:, n : n + 1], alone, rtol=1e-6)

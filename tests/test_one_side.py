"""covey.wrappers.one_side: one side of a PettingZoo env of opposing sides as an env of its own, the others acting
at random, by a function or by a model, so that POCA trains that side as its group."""

from __future__ import annotations

import numpy as np
import pytest
from mpe2 import simple_tag_v3
from pettingzoo.test import parallel_api_test

from covey import POCA
from covey.evaluation import evaluate_group
from covey.wrappers import one_side

TEAM = ["adversary_0", "adversary_1", "adversary_2"]


def tag(**kwargs):
    return simple_tag_v3.parallel_env(num_good=1, num_adversaries=3, num_obstacles=1, max_cycles=20, **kwargs)


def test_it_lists_the_team_and_passes_pettingzoos_api_test():
    env = one_side(tag(), "adversary")
    assert env.possible_agents == TEAM
    observations, infos = env.reset(seed=0)
    assert sorted(observations) == sorted(infos) == TEAM
    assert env.agents == TEAM
    step = env.step({agent: env.action_space(agent).sample() for agent in TEAM})
    assert all(sorted(d) == TEAM for d in step)
    assert one_side(tag(), ["agent_0"]).possible_agents == ["agent_0"]
    parallel_api_test(one_side(tag(), "adversary"), num_cycles=30)


def test_one_agents_id_is_that_agent_where_it_also_prefixes_others():
    """With 11 adversaries, "adversary_1" names that agent (not adversary_10 and _11 too); "adversary_" is a prefix."""
    many = simple_tag_v3.parallel_env(num_good=1, num_adversaries=11, num_obstacles=1)
    assert one_side(many, "adversary_1").possible_agents == ["adversary_1"]
    assert len(one_side(many, "adversary_").possible_agents) == 11


def test_the_team_sees_the_env_as_if_it_stepped_it_with_the_others_actions():
    """Against stepping the env itself with the team's actions and the others' (a function's, fixed here): the
    team's observations, rewards and ends are the env's, and the function gets the prey's observations."""
    seen = []

    def prey(observations):
        seen.append({agent: obs.copy() for agent, obs in observations.items()})
        return {agent: 2 for agent in observations}

    wrapped, raw = one_side(tag(), "adversary", others=prey), tag()
    ours, _ = wrapped.reset(seed=3)
    theirs, _ = raw.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        for agent in TEAM:
            np.testing.assert_array_equal(ours[agent], theirs[agent])
        actions = {agent: int(rng.integers(5)) for agent in TEAM}
        ours, rewards, terminations, truncations, _ = wrapped.step(actions)
        np.testing.assert_array_equal(seen[-1]["agent_0"], theirs["agent_0"])  # the prey acted on its observation
        theirs, raw_rewards, raw_terminations, raw_truncations, _ = raw.step({**actions, "agent_0": 2})
        assert rewards == {agent: raw_rewards[agent] for agent in TEAM}
        assert truncations == {agent: raw_truncations[agent] for agent in TEAM}
        assert terminations == {agent: raw_terminations[agent] for agent in TEAM}
    assert len(seen) == 20 and all(list(s) == ["agent_0"] for s in seen)
    assert wrapped.agents == [] and raw.agents == []  # the episode's end (max_cycles), for both


def test_random_opponents_follow_the_reset_seed():
    def episode(seed):
        env = one_side(tag(), "adversary")
        obs, _ = env.reset(seed=seed)
        trail = []
        for _ in range(10):
            obs = env.step({agent: 0 for agent in TEAM})[0]
            trail.append(obs["adversary_0"])  # it observes the prey, which moved at random
        return np.stack(trail)

    np.testing.assert_array_equal(episode(4), episode(4))
    assert not np.array_equal(episode(4), episode(5))


def test_poca_trains_one_side_against_a_model_of_the_other():
    """POCA's group is the side's agents; the group return is theirs alone; a POCA model of the prey acts for
    them through its predict."""
    prey = POCA("MlpPolicy", lambda: one_side(tag(), "agent"), n_steps=16, batch_size=16, seed=0).learn(32)
    assert prey.agent_ids == ["agent_0"]
    calls = []
    predict = prey.predict

    def counted(observations, **kwargs):
        calls.append(sorted(observations))
        return predict(observations, **kwargs)

    prey.predict = counted
    make = lambda: one_side(tag(), "adversary", others=prey)  # noqa: E731
    model = POCA("MlpPolicy", make, n_envs=2, n_steps=16, batch_size=32, seed=0).learn(64)
    assert model.agent_ids == TEAM
    assert calls and all(c == ["agent_0"] for c in calls)
    # the group return counts the adversaries' rewards only: against one_side on the raw env, summed by hand
    result = evaluate_group(model, make, n_eval_episodes=1, deterministic=True, seed=7)
    env = make()
    obs, _ = env.reset(seed=7)
    total = 0.0
    while env.agents:
        actions, _ = model.predict(obs, deterministic=True)
        obs, rewards, _, _, _ = env.step(actions)
        total += sum(rewards.values())
    assert result["group_return"] == pytest.approx(total)


@pytest.mark.parametrize(
    ("team", "others", "message"),
    [
        ("hunter", None, r"no agents whose ids start with 'hunter'; its possible_agents are \['adversary_0'"),
        (["adversary_0", "wolf"], None, r"\['wolf'\] are not agents of the env"),
        ("a", None, r"is every agent of the env"),
        ("adversary", "model.zip", r"others='model.zip' is invalid: pass None"),
    ],
)
def test_bad_arguments_are_named(team, others, message):
    with pytest.raises(ValueError, match=message):
        one_side(tag(), team, others=others)


def test_actions_for_the_other_side_are_refused():
    env = one_side(tag(), "adversary")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions for \['agent_0'\], which are not the team's agents"):
        env.step({**{agent: 0 for agent in TEAM}, "agent_0": 1})


def test_it_takes_an_aec_env_as_poca_does():
    """one_side around PettingZoo's default AEC env (simple_tag_v3.env()) failed at reset with a bare TypeError,
    and POCA mistook the wrapper for an AEC env through the attributes a parallel wrapper passes on."""
    from covey.wrappers.group_env import as_parallel

    aec = simple_tag_v3.env(num_good=1, num_adversaries=3, num_obstacles=1, max_cycles=20)
    env = one_side(aec, "adversary")
    assert env.possible_agents == TEAM and as_parallel(env) is env
    observations, _ = env.reset(seed=0)
    assert sorted(observations) == TEAM
    parallel = one_side(tag(), "adversary")
    np.testing.assert_array_equal(observations["adversary_1"], parallel.reset(seed=0)[0]["adversary_1"])
    model = POCA("MlpPolicy", lambda: one_side(simple_tag_v3.env(max_cycles=20), "adversary"), n_steps=32, seed=0)
    model.learn(64)
    assert model.num_timesteps == 64

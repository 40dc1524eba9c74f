"""GymTextEnv on real Gymnasium envs (FrozenLake-v1, CliffWalking-v1, Taxi-v4)."""

import warnings

import pytest

gymnasium = pytest.importorskip("gymnasium", reason="GymTextEnv needs gymnasium (the `gym` extra)")
np = pytest.importorskip("numpy")

from arborl.env import check_env, guard  # noqa: E402
from arborl.env.gym_adapter import GymTextEnv, to_hashable  # noqa: E402

LAKE_ACTIONS = ["Left", "Down", "Right", "Up"]


@pytest.fixture(autouse=True)
def _quiet_gym_deprecations():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def lake():
    return GymTextEnv("FrozenLake-v1", action_names=LAKE_ACTIONS, is_slippery=False)


def test_frozenlake_route_to_goal():
    # Gymnasium's 4x4 map SFFF/FHFH/FFFH/HFFG; states are row * 4 + col
    env = lake()
    obs, _ = env.reset(seed=0)
    assert obs == 0 and env.state_key() == 0 and env.format_observation(obs) == "0"
    results = [env.step(a) for a in ["Right", "Right", "Down", "Down", "Down"]]
    assert [r.obs for r in results] == [1, 2, 6, 10, 14]
    last = env.step("<answer>right</answer>")
    assert (last.obs, last.reward, last.terminated, last.truncated) == (15, 1.0, True, False)
    assert last.info["success"] is True and last.info["action"] == "Right"
    assert env.task_type == "gym:FrozenLake-v1"


def test_frozenlake_hole_is_a_failure_and_step_after_end_is_answered():
    env = guard(lake())
    env.reset(seed=0)
    env.step("Down")
    hole = env.step("Right")  # state 5 is a hole
    assert (hole.obs, hole.reward, hole.terminated) == (5, 0.0, True) and hole.info["success"] is False
    after = env.step("Up")
    assert after.truncated and after.info["action_valid"] is False and "reset()" in after.info["error"]
    assert env.state_key() == 5


def test_invalid_text_leaves_state_unchanged():
    env = lake()
    env.reset(seed=0)
    env.step("Right")
    res = env.step("north-east")
    assert res.info["action_valid"] is False and res.reward == 0.0 and res.obs == 1 and env.state_key() == 1
    assert "Left, Down, Right, Up" in res.info["error"]


def test_default_action_names_are_indices_and_render_obs_is_used():
    env = GymTextEnv("FrozenLake-v1", is_slippery=False, render_obs=lambda s: f"cell {s}")
    assert env.actions == ("0", "1", "2", "3")
    obs, _ = env.reset(seed=0)
    res = env.step("<answer>2</answer>")  # 2 = Right
    assert res.obs == 1 and env.format_observation(res.obs) == "cell 1"


def test_cliffwalking_with_custom_success():
    env = GymTextEnv("CliffWalking-v1", action_names=["Up", "Right", "Down", "Left"],
                     success_fn=lambda obs, reward, terminated, truncated, info: terminated)
    obs, _ = env.reset(seed=0)
    assert obs == 36  # bottom-left of the 4x12 grid
    assert env.step("Up").obs == 24
    env.step("Down")
    cliff = env.step("Right")  # the cliff sends the agent back to the start with -100
    assert (cliff.obs, cliff.reward, cliff.terminated) == (36, -100.0, False)
    env.step("Up")
    for _ in range(11):
        res = env.step("Right")
    res = env.step("Down")
    assert res.obs == 47 and res.terminated and res.info["success"] is True


@pytest.mark.parametrize("make", [lake, lambda: GymTextEnv("Taxi-v4"), lambda: GymTextEnv("CliffWalking-v1")])
def test_passes_check_env(make):
    env = make()
    for seed in range(3):
        check_env(env, seed=seed, n_steps=200)


def test_non_discrete_action_space_is_refused_with_a_fix():
    with pytest.raises(TypeError, match=r"action space Box\(.*is not Discrete.*ActionWrapper"):
        GymTextEnv("Pendulum-v1")


def test_wrong_number_of_action_names():
    with pytest.raises(ValueError, match="3 action_names for a Discrete\\(4\\) space"):
        GymTextEnv("FrozenLake-v1", action_names=["a", "b", "c"])


def test_make_kwargs_need_an_id():
    with pytest.raises(TypeError, match="only apply when passing an env id"):
        GymTextEnv(gymnasium.make("FrozenLake-v1"), is_slippery=False)


def test_to_hashable_keeps_equality():
    a, b = np.arange(6).reshape(2, 3), np.arange(6).reshape(2, 3)
    assert to_hashable(a) == to_hashable(b) and hash(to_hashable(a)) == hash(to_hashable(b))
    assert to_hashable(a) != to_hashable(a.reshape(3, 2))
    assert to_hashable({"pos": np.int64(3), "seen": [1, 2]}) == (("pos", 3), ("seen", (1, 2)))
    assert to_hashable(np.float32(0.5)) == 0.5

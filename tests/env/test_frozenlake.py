"""FrozenLake: hand-computed moves, rewards and observations; generation and expert invariants."""

import subprocess
import sys
from collections import Counter

import pytest

from arborl.env import check_env, guard
from arborl.env.envs import FrozenLake
from arborl.env.envs._grid import in_heldout_part
from arborl.env.envs.frozenlake import HELDOUT_SEED_START, generate_map, heldout_maps, map_fingerprint

# Gymnasium's classic 4x4 map: S top-left, G bottom-right.
CLASSIC = ["SFFF", "FHFH", "FFFH", "HFFG"]


def play(env, actions):
    return [env.step(a) for a in actions]


def test_shortest_route_reaches_goal_with_reward_one():
    env = FrozenLake()
    obs, info = env.reset(seed=0, options={"desc": CLASSIC})
    assert info["desc"] == tuple(CLASSIC)
    assert env.format_observation(obs) == "0:P___ 1:_H_H 2:___H 3:H__G"
    results = play(env, ["Right", "Right", "Down", "Down", "Down"])
    assert env.format_observation(results[0].obs) == "0:_P__ 1:_H_H 2:___H 3:H__G"
    assert env.format_observation(results[-1].obs) == "0:____ 1:_H_H 2:___H 3:H_PG"
    assert all(r.reward == 0.0 and not r.terminated and not r.truncated for r in results)
    assert all(r.info["action_valid"] and "success" not in r.info for r in results)
    last = env.step("<answer>Right</answer>")
    assert (last.reward, last.terminated, last.truncated) == (1.0, True, False)
    assert last.info["success"] is True and last.info["action"] == "Right"
    assert env.format_observation(last.obs) == "goal 0:____ 1:_H_H 2:___H 3:H__P"


def test_falling_in_a_hole_ends_with_failure():
    env = FrozenLake()
    env.reset(seed=0, options={"desc": CLASSIC})
    first, hole = play(env, ["Down", "Right"])  # (1,0) is ice, (1,1) is a hole
    assert not first.terminated
    assert (hole.reward, hole.terminated, hole.truncated) == (0.0, True, False)
    assert hole.info["success"] is False
    assert env.format_observation(hole.obs) == "hole 0:____ 1:_P_H 2:___H 3:H__G"


def test_moving_off_the_edge_stays_put_and_is_valid():
    env = FrozenLake()
    env.reset(seed=0, options={"desc": CLASSIC})
    key = env.state_key()
    res = env.step("Left")
    assert res.info["action_valid"] is True and env.state_key() == key == ("SFFF/FHFH/FFFH/HFFG", 0, 0)


def test_invalid_action_leaves_state_unchanged_and_says_why():
    env = FrozenLake()
    env.reset(seed=0, options={"desc": CLASSIC})
    env.step("Right")
    key = env.state_key()
    res = env.step("jump over the hole")
    assert res.info["action_valid"] is False and res.info["action"] is None
    assert res.reward == 0.0 and not res.terminated and not res.truncated
    assert "jump over the hole" in res.info["error"]
    assert env.state_key() == key
    assert env.format_observation(res.obs) == "invalid 0:_P__ 1:_H_H 2:___H 3:H__G"


def test_grid_format_has_legend_message_and_actions():
    env = FrozenLake(obs_format="grid")
    env.reset(seed=0, options={"desc": CLASSIC})
    text = env.format_observation(env.step("???").obs)
    lines = text.splitlines()
    assert "Legend: P = you, G = goal, H = hole, _ = frozen ice." in lines
    assert any(line.startswith("Invalid action '???'") for line in lines)
    assert lines[-5:-1] == ["P _ _ _", "_ H _ H", "_ _ _ H", "H _ _ G"]
    assert lines[-1].startswith("Valid actions: Left, Down, Right, Up.")


def test_step_limit_truncates_and_counts_invalid_actions():
    env = FrozenLake(max_steps=3)
    env.reset(seed=0, options={"desc": CLASSIC})
    a, b, c = play(env, ["Left", "nonsense", "Up"])
    assert not a.truncated and not b.truncated
    assert (c.reward, c.terminated, c.truncated) == (0.0, False, True)
    assert c.info["success"] is False
    assert env.format_observation(c.obs).startswith("timeout ")


def test_step_after_end_returns_truncated_with_error():
    env = guard(FrozenLake())
    env.reset(seed=0, options={"desc": ["SG"]})
    assert env.step("Right").terminated
    key = env.state_key()
    res = env.step("Left")
    assert (res.reward, res.terminated, res.truncated) == (0.0, False, True)
    assert res.info["action_valid"] is False and "reset()" in res.info["error"] and res.info["success"] is True
    assert env.state_key() == key


def test_expert_takes_a_shortest_path():
    env = FrozenLake()
    env.reset(seed=0, options={"desc": CLASSIC})
    steps = 0
    while True:
        res = env.step(env.expert_action())
        steps += 1
        if res.terminated or res.truncated:
            break
    assert res.info["success"] is True and steps == 6  # Manhattan distance (0,0) -> (3,3)


def test_generated_maps_are_solvable_by_the_expert():
    env = FrozenLake()
    for seed in range(200):
        env.reset(seed=seed)
        for _ in range(env.max_steps):
            res = env.step(env.expert_action())
            if res.terminated or res.truncated:
                break
        assert res.info["success"] is True, seed


def test_map_generation_is_pure_across_processes():
    seeds = [0, 1, 7, 123_456, HELDOUT_SEED_START + 3]
    here = [generate_map(s) for s in seeds]
    code = f"from arborl.env.envs.frozenlake import generate_map; print([generate_map(s) for s in {seeds}])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "4242", "PATH": ""}).stdout
    assert out.strip() == repr(here)
    assert generate_map(5) != generate_map(6)


def test_generated_maps_have_one_start_one_goal_and_given_size():
    for seed in range(100):
        desc = generate_map(seed, size=6, hole_prob=0.25)
        text = "".join(desc)
        assert len(desc) == 6 and all(len(r) == 6 for r in desc)
        assert text.count("S") == 1 and text.count("G") == 1 and set(text) <= set("SFHG")
    assert generate_map(3, fixed_corners=True)[0][0] == "S" and generate_map(3, fixed_corners=True)[3][3] == "G"


def test_same_seed_same_episode_and_state_keys_shared_across_episodes():
    a, b = FrozenLake(), FrozenLake()
    obs_a, _ = a.reset(seed=11)
    obs_b, _ = b.reset(seed=11)
    assert a.format_observation(obs_a) == b.format_observation(obs_b)
    assert a.state_key() == b.state_key() and hash(a.state_key()) == hash(b.state_key())
    # reset(seed) then reset() replays the same sequence of maps
    a.reset(seed=3)
    b.reset(seed=3)
    assert [a.reset()[1]["desc"] for _ in range(3)] == [b.reset()[1]["desc"] for _ in range(3)]


def test_heldout_maps_are_distinct_and_never_come_from_training_seeds():
    held = heldout_maps(512)
    assert len(held) == 512 and len({d for _, d in held}) == 512
    assert all(seed >= HELDOUT_SEED_START and in_heldout_part(map_fingerprint(d)) for seed, d in held)
    train = {generate_map(s) for s in range(5000)}
    assert not train & {d for _, d in held}
    env = FrozenLake()
    seed, desc = held[17]
    assert env.reset(seed=seed)[1]["desc"] == desc


def test_slippery_moves_intended_or_perpendicular_one_third_each():
    env = FrozenLake(is_slippery=True)
    open_map = ["FFFFF", "FFFFF", "FFSFF", "FFFFF", "FFFFG"]
    env.reset(seed=0, options={"desc": open_map})
    counts = Counter()
    for _ in range(3000):
        env.reset(options={"desc": open_map})
        res = env.step("Up")
        counts[res.info["moved"]] += 1
        row, col = env.state_key()[1:]
        assert (row, col) == {"Up": (1, 2), "Left": (2, 1), "Right": (2, 3)}[res.info["moved"]]
    assert set(counts) == {"Up", "Left", "Right"}  # never the opposite direction
    assert all(900 <= n <= 1100 for n in counts.values()), counts  # 1000 expected, sd ~26


def test_slippery_expert_avoids_the_risky_straight_move():
    # From S, "Right" slides into a hole with p=2/3; "Down" (or "Up") risks only 1/3 and reaches
    # F with 1/3, so the optimal first action is Down (the first of the two in action order).
    env = FrozenLake(is_slippery=True)
    env.reset(seed=0, options={"desc": ["HHH", "SFG", "HHH"]})
    assert env.expert_action() == "Down"
    assert env.deterministic is False


def test_slippery_expert_beats_random_play():
    env = FrozenLake(is_slippery=True, max_steps=100)
    env.reset(seed=1, options={"desc": CLASSIC})
    wins = 0
    for _ in range(300):
        env.reset(options={"desc": CLASSIC})
        while True:
            res = env.step(env.expert_action())
            if res.terminated or res.truncated:
                break
        wins += res.info["success"]
    assert wins / 300 > 0.65  # the optimal success rate on this map is about 0.8; random play ~0.02


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 1}, "size=1 must be an int >= 2"),
        ({"hole_prob": 1.0}, "hole_prob=1.0 must be in"),
        ({"obs_format": "pixels"}, "obs_format='pixels' is unknown"),
        ({"max_steps": 0}, "max_steps=0 must be a positive int"),
    ],
)
def test_bad_settings_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FrozenLake(**kwargs)


def test_bad_reset_options_raise_clear_errors():
    env = FrozenLake()
    with pytest.raises(ValueError, match="exactly one S and one G"):
        env.reset(options={"desc": ["SFF", "FG"]})
    with pytest.raises(ValueError, match="unknown options"):
        env.reset(options={"map": CLASSIC})
    with pytest.raises(RuntimeError, match="call reset"):
        FrozenLake().step("Left")


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"is_slippery": True}, {"obs_format": "grid", "size": 6}, {"fixed_corners": True, "size": 8}],
)
def test_passes_check_env(kwargs):
    env = FrozenLake(**kwargs)
    for seed in (0, 1, HELDOUT_SEED_START):
        check_env(env, seed=seed, n_steps=60)


def test_rows_cols_format_lists_each_column_top_to_bottom():
    from arborl.env.envs import FrozenLake

    env = FrozenLake(obs_format="rows+cols")
    obs, _ = env.reset(options={"desc": ["SFFH", "FFFF", "FHFF", "HFFG"]})
    assert env.format_observation(obs) == "0:P__H 1:____ 2:_H__ 3:H__G c0:P__H c1:__H_ c2:____ c3:H__G"


def test_progress_reward_is_plus_c_closer_minus_c_away_or_hole():
    from arborl.env.envs import FrozenLake

    env = FrozenLake(progress_reward=0.1)
    env.reset(options={"desc": ["SFFH", "FFFF", "FHFF", "HFFG"]})
    assert env.step("Right").reward == pytest.approx(0.1)   # distance 6 -> 5
    assert env.step("Left").reward == pytest.approx(-0.1)   # 5 -> 6
    assert env.step("Up").reward == 0.0                     # bump into the edge
    env.step("Down")
    res = env.step("Right")                                 # (1,0) -> (1,1): 5 -> 4
    assert res.reward == pytest.approx(0.1)
    res = env.step("Down")                                  # into the hole at (2,1)
    assert res.terminated and res.reward == pytest.approx(-0.1)

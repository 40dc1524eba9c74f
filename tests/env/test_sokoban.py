"""Sokoban: push mechanics on hand-written rooms, generation and expert invariants."""

import pytest

from arborl.env import check_env
from arborl.env.envs import Sokoban
from arborl.env.envs.sokoban import generate_room, parse_room, render_room, solve

CORRIDOR = ["#######", "#P_X_O#", "#######"]


def test_pushing_the_box_onto_the_target_solves():
    env = Sokoban()
    obs, info = env.reset(options={"room": CORRIDOR})
    assert info["optimal_steps"] is None
    assert env.format_observation(obs) == "0:####### 1:#P_X_O# 2:#######"
    walk, push, solve_push = (env.step("Right") for _ in range(3))
    assert env.format_observation(walk.obs) == "0:####### 1:#_PX_O# 2:#######"
    assert env.format_observation(push.obs) == "0:####### 1:#__PXO# 2:#######"
    assert walk.reward == push.reward == 0.0 and not push.terminated
    assert (solve_push.reward, solve_push.terminated, solve_push.truncated) == (1.0, True, False)
    assert solve_push.info["success"] is True and solve_push.info["boxes_on_target"] == 1
    assert env.format_observation(solve_push.obs) == "solved 0:####### 1:#___PV# 2:#######"


def test_push_into_wall_is_a_valid_noop_and_player_on_target_shows_S():
    env = Sokoban()
    env.reset(options={"room": ["######", "#O_PX#", "######"]})
    key = env.state_key()
    blocked = env.step("Right")
    assert blocked.info["action_valid"] is True and blocked.info["moved"] is False
    assert env.state_key() == key and blocked.reward == 0.0
    assert blocked.obs.message == "Blocked: nothing moved."
    env.step("Left")
    on_target = env.step("Left")
    assert env.format_observation(on_target.obs) == "0:###### 1:#S__X# 2:######"


def test_push_into_another_box_is_a_noop():
    env = Sokoban()
    env.reset(options={"room": ["#######", "#PXX_O#", "#____O#", "#######"]})
    key = env.state_key()
    assert env.step("Right").info["moved"] is False and env.state_key() == key


def test_box_reward_shaping_on_and_off_target():
    env = Sokoban(box_reward=0.1)
    env.reset(options={"room": ["#######", "#PXO__#", "#_X__O#", "#######"]})
    onto = env.step("Right")
    assert onto.reward == pytest.approx(0.1) and onto.info["boxes_on_target"] == 1 and not onto.terminated
    off = env.step("Right")
    assert off.reward == pytest.approx(-0.1) and off.info["boxes_on_target"] == 0


def test_invalid_action_leaves_state_unchanged():
    env = Sokoban(obs_format="grid")
    env.reset(options={"room": CORRIDOR})
    key = env.state_key()
    res = env.step("push it!")
    assert res.info["action_valid"] is False and res.reward == 0.0 and env.state_key() == key
    text = env.format_observation(res.obs)
    assert "Invalid action 'push it!'" in text and "# P _ X _ O #" in text.splitlines()


def test_solver_plans_and_state_keys():
    height, width, walls, targets, start = parse_room(["######", "#____#", "#PX_O#", "#____#", "######"])
    assert solve(walls, targets, height, width, start) == [3, 3]  # Right, Right: push the box two cells
    assert render_room(height, width, walls, targets, start)[2] == "#PX_O#"
    env = Sokoban()
    env.reset(options={"room": CORRIDOR})
    assert env.state_key() == ("#######/#____O#/#######", 8, (10,))  # cells are row * 7 + col


def test_expert_replans_after_leaving_the_plan():
    env = Sokoban()
    env.reset(options={"room": ["#######", "#_____#", "#P_X_O#", "#_____#", "#######"]})
    assert env.expert_action() == "Right"
    env.step("Up")  # off the plan
    steps = 1
    while True:
        res = env.step(env.expert_action())
        steps += 1
        if res.terminated or res.truncated:
            break
    assert res.info["success"] is True and steps == 1 + 4  # e.g. Down, then Right x3


def test_expert_in_a_deadlock_returns_the_first_action():
    env = Sokoban()
    env.reset(options={"room": ["#####", "#X_P#", "#__O#", "#####"]})  # box stuck in a corner
    assert env.expert_action() == "Up"


def test_generated_rooms_are_solved_by_the_expert_in_optimal_steps():
    env = Sokoban()
    for seed in range(200):
        _, info = env.reset(seed=seed)
        assert not set(env.state_key()[2]) <= {i for i, s in enumerate("".join(info["room"])) if s in "OVS"}
        steps = 0
        while True:
            res = env.step(env.expert_action())
            steps += 1
            if res.terminated or res.truncated:
                break
        assert res.info["success"] is True, seed
        assert steps == info["optimal_steps"] <= env.max_steps


@pytest.mark.parametrize(("dim", "num_boxes"), [((6, 6), 2), ((7, 7), 3)])
def test_generated_multi_box_rooms_are_solvable(dim, num_boxes):
    env = Sokoban(dim=dim, num_boxes=num_boxes)
    for seed in range(30):
        _, info = env.reset(seed=seed)
        room = "".join(info["room"])
        assert room.count("X") + room.count("V") == num_boxes
        assert 1 <= info["optimal_steps"] <= env.max_steps
        steps = 0
        while True:  # the expert (BFS over every box) solves the room in exactly its optimal steps
            res = env.step(env.expert_action())
            steps += 1
            if res.terminated or res.truncated:
                break
        assert res.info["success"] is True and steps == info["optimal_steps"], seed


def test_generation_is_deterministic_per_seed():
    assert generate_room(3) == generate_room(3)
    assert Sokoban().reset(seed=9)[1]["room"] == Sokoban().reset(seed=9)[1]["room"]
    assert len({generate_room(s)[0] for s in range(50)}) > 40


def test_generation_gives_up_with_a_clear_error():
    with pytest.raises(RuntimeError, match="no solvable room within 0 attempts"):
        generate_room(0, max_gen_attempts=0)


@pytest.mark.parametrize(
    ("room", "message"),
    [
        (["#####", "#PXO#", "#PXO#", "#####"], "2 players"),
        (["#####", "#PXX#", "#__O#", "#####"], "2 boxes and 1 targets"),
        (["#####", "_PXO#", "#####"], "border is not all"),
        (["####", "#PX", "####"], "not a rectangle"),
    ],
)
def test_bad_rooms_raise_clear_errors(room, message):
    with pytest.raises(ValueError, match=message):
        Sokoban().reset(options={"room": room})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"dim": 3}, "between 4 and 16"), ({"dim": 4, "num_boxes": 2}, "does not fit"), ({"obs_format": "x"}, "unknown")],
)
def test_bad_settings_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sokoban(**kwargs)


@pytest.mark.parametrize("kwargs", [{}, {"num_boxes": 2, "obs_format": "grid"}, {"dim": (7, 8), "box_reward": 0.1}])
def test_passes_check_env(kwargs):
    env = Sokoban(**kwargs)
    for seed in (0, 1, 1_000_000):
        check_env(env, seed=seed, n_steps=60)


def test_a_group_revisits_states_so_gigpo_finds_the_blocked_move_grpo_cannot():
    """Two rollouts of one room, both solved: GRPO has no signal, GiGPO's anchor groups do.

    A: Right x3. B: Left (into the wall: a no-op), then Right x3. The states acted from are
    s0 (A0, B0, B1), s1 (A1, B2), s2 (A2, B3): every step sits in a step group of 2 or more.
    Returns (gamma 0.95): A 0.9025, 0.95, 1; B 0.857375, 0.9025, 0.95, 1. From s1 and s2 both
    finish alike (A^S = 0); with mean_norm the s0 group's mean is 2.662375 / 3, so B's wasted
    Left gets -0.030083 and the two Rights from s0 +0.015042.
    """
    import torch

    from arborl.credit import StepBatch, gigpo, grpo

    env = Sokoban()
    keys, episode, reward = [], [], []
    for e, moves in enumerate((["Right"] * 3, ["Left"] + ["Right"] * 3)):
        env.reset(options={"room": CORRIDOR})
        for move in moves:
            keys.append(env.state_key())
            episode.append(e)
            res = env.step(move)
            reward.append(res.reward)
        assert res.terminated and res.info["success"]
    ids = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    assert [ids[k] for k in keys] == [0, 1, 2, 0, 0, 1, 2]
    batch = StepBatch(episode=torch.tensor(episode), step=torch.tensor([0, 1, 2, 0, 1, 2, 3]),
                      reward=torch.tensor(reward), anchor=torch.tensor([ids[k] for k in keys]),
                      group=torch.tensor([0, 0]), score=torch.tensor([1.0, 1.0]))
    assert reward == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert grpo(batch).tolist() == [0.0] * 7
    expected = [0.015042, 0.0, 0.0, -0.030083, 0.015042, 0.0, 0.0]
    assert gigpo(batch, gamma=0.95, norm_by_std=False).tolist() == pytest.approx(expected, abs=1e-6)

"""A small store built by hand for the viewer tests (:func:`build_episodes`), with every expected value known in advance.

Episodes (``created_at`` = T0 + k, so newest first is the reverse of this list):

* ``a``, ``b``, ``c``: group ``g1`` (task ``t1``, iteration 1), actions ``a``: Left Down Right,
  ``b``: Left Down Up, ``c``: Left Right; all start in state ``s0``, ``a`` and ``b`` reach ``s1``.
  First divergence: turn 1 (Down, Down, Right). ``c`` failed (success 0); ``a``, ``b`` succeeded.
* ``a-br``: a branch of ``a`` from turn 1 (shares ``a``'s first turn), forced action Up, group g1.
* ``tree``: one root with two children (``x`` off the main path, ``y`` on it), group ``g2``.
* ``err``: stop reason ``env_error``, its one turn carries an error, group ``g3``.
* ``long``: 20 turns, tokens with loss mask 0 and log-probs, advantages, an image, group ``g4``.
"""

from __future__ import annotations

import struct
import zlib

from arborl.trajectory.schema import Episode, Origin, ToolCall, Turn

T0 = 1_700_000_000.0


def _png() -> bytes:
    """A valid 2x2 red PNG (so the browser decodes the inline image)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * 2 for _ in range(2))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


PNG = _png()


def _turn(eid: str, k: int, action: str, state: str, parent: str | None, **kw) -> Turn:
    return Turn(turn_id=f"{eid}-{k}", parent_id=parent, index=k, observation=f"{eid} sees {state}",
                prompt_ids=[1, 2, 3], output_ids=[10 + k, 2], output_logprobs=[-0.1, 0.0], output_mask=[1, 0],
                action_text=action, action=action, state_key=state, reward=kw.pop("reward", 0.0),
                timings={"generate": 0.01, "env": 0.001}, **kw)


def _chain(eid: str, actions: list[str], states: list[str], *, group: str = "g1", k: int = 0,
           success: float | None = 1.0, **kw) -> Episode:
    ep = Episode(episode_id=eid, task_id="t1", task_type="frozenlake", group_id=group, rewards={"success": success},
                 stop_reason=kw.pop("stop_reason", "terminated"), iteration=kw.pop("iteration", 1), source="rl",
                 created_at=T0 + k, **kw)
    parent = None
    for i, (a, s) in enumerate(zip(actions, states, strict=True)):
        t = _turn(eid, i, a, s, parent, reward=1.0 if i == len(actions) - 1 and success else 0.0)
        ep.add_turn(t)
        parent = t.turn_id
    return ep


def build_episodes(store) -> dict[str, Episode]:
    """The episodes of the module docstring, stored in ``store``; returns them by id."""
    a = _chain("a", ["Left", "Down", "Right"], ["s0", "s1", "s2"], k=0)
    b = _chain("b", ["Left", "Down", "Up"], ["s0", "s1", "s3"], k=1)
    c = _chain("c", ["Left", "Right"], ["s0", "s4"], k=2, success=0.0)
    br = Episode(episode_id="a-br", task_id="t1", task_type="frozenlake", group_id="g1", rewards={"success": 0.0},
                 stop_reason="terminated", iteration=1, source="rl-branch", created_at=T0 + 3,
                 origin=Origin(of="a", turn=1, kind="branch", action="Up", state_key="s1"))
    br.turns = [a.turns[0]]
    br.add_turn(_turn("a-br", 1, "Up", "s1", "a-0", reward=-0.5))
    tree = Episode(episode_id="tree", task_id="t2", task_type="frozenlake", group_id="g2", rewards={"success": 1.0},
                   stop_reason="terminated", iteration=1, source="rl", created_at=T0 + 4)
    tree.add_turn(_turn("tree", 0, "Left", "r", None))
    tree.add_turn(Turn(turn_id="x", parent_id="tree-0", index=1, observation="off path", action_text="Up", reward=0.0))
    tree.add_turn(Turn(turn_id="y", parent_id="tree-0", index=1, observation="on path", action_text="Down", reward=1.0))
    err = _chain("err", ["search(q)"], ["e0"], group="g3", k=5, success=None, stop_reason="env_error",
                 metadata={"error": "tool crashed"})
    err.turns[0].error = "ToolError: the search backend timed out"
    err.turns[0].tool_call = ToolCall(name="search", arguments={"q": "capital of France"})
    err.turns[0].result = None
    long = _chain("long", [f"step {i}" for i in range(20)], [f"L{i}" for i in range(20)], group="g4", k=6,
                  iteration=2)
    long.turns[3].info["advantages"] = {"grpo": 0.5, "gigpo": -0.25}
    long.turns[0].media = [store.put_media(PNG, "image/png")]
    store.put_many([a, b, c, br, tree, err, long])
    return {e.episode_id: e for e in (a, b, c, br, tree, err, long)}

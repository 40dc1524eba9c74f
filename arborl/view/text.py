"""One episode as readable text in the terminal (``arborl store show STORE_URL EPISODE_ID``).

The same content as the browser's episode view (:func:`arborl.view.data.episode_json`): the
episode's facts, then its tree of turns (a branch point shows each branch under it), each turn
with its observation, the model's output, the tool call and result, step reward, validity,
error, timings, advantages when recorded, and how many output tokens have loss mask 0.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from arborl.trajectory.schema import Episode
from arborl.view.data import episode_json


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def _facts(head: dict[str, Any]) -> Table:
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    for k in ("task_type", "task_id", "group_id", "source", "iteration", "policy_version", "reward", "success",
              "stop_reason", "n_turns", "n_nodes", "rewards", "tags", "seed", "error"):
        if head.get(k) not in (None, "", [], {}):
            t.add_row(k, _fmt(head[k]))
    o = head["origin"]
    if o:
        t.add_row("origin", f"{o['kind']} of {o['of']} from turn {o['turn']}" + (f", action {o['action']}" if o["action"] else ""))
    return t


def _turn(t: dict[str, Any]) -> Group:
    parts: list[Any] = [Text(f"turn {t['index']}" + (f"  state {t['state_key']}" if t["state_key"] else ""),
                             style="bold" if t["on_main_path"] else "bold dim")]
    parts.append(Text.assemble(("observation: ", "cyan"), t["observation"]))
    parts.append(Text.assemble(("output: ", "cyan"), t["action_text"]))
    masked = sum(1 for k in t["tokens"] if not k["mask"])
    parts.append(Text(f"tokens: prompt {t['n_prompt_tokens']}, output {len(t['tokens'])} ({masked} with loss mask 0)",
                      style="dim"))
    if t["tool_call"]:
        tc = t["tool_call"]
        parts.append(Text.assemble(("tool call: ", "cyan"), f"{tc['name']}({tc['arguments']})"))
    if t["result"] is not None:
        parts.append(Text.assemble(("result: ", "cyan"), t["result"]))
    flags = [f"reward {_fmt(t['reward'])}", "valid" if t["valid"] else "INVALID"]
    flags += [f for f in ("terminated", "truncated") if t[f]]
    parts.append(Text("  ".join(flags), style="green" if t["valid"] else "red"))
    if t["error"]:
        parts.append(Text(f"error: {t['error']}", style="red"))
    if t["timings"]:
        parts.append(Text("timings: " + ", ".join(f"{k} {_fmt(v)} s" for k, v in t["timings"].items()), style="dim"))
    if t["advantages"]:
        parts.append(Text("advantage: " + ", ".join(f"{k} {_fmt(v)}" for k, v in t["advantages"].items())))
    return Group(*parts)


def render_episode(ep: Episode, console: Console | None = None) -> None:
    """Print ``ep`` (facts, then its tree of turns) to ``console`` (default: stdout)."""
    console = console or Console()
    d = episode_json(ep)
    by_id = {t["turn_id"]: t for t in d["turns"]}
    tree = Tree(Text(f"episode {ep.episode_id}", style="bold"))

    def add(node: Tree, turn_id: str) -> None:
        # a chain of single children stays at one level; a branch point nests each branch
        while True:
            t = by_id[turn_id]
            node.add(_turn(t))
            kids = t["children"]
            if len(kids) != 1:
                break
            turn_id = kids[0]
        for k, kid in enumerate(kids):
            add(node.add(Text(f"branch {k + 1} of {len(kids)}", style="magenta")), kid)

    for root in d["roots"]:
        add(tree, root)
    console.print(_facts(d["episode"]))
    console.print(tree)

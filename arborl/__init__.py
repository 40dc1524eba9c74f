"""arborl: reinforcement learning for multi-turn, tool-calling LLM agents.

Data flows one way: ``env -> rollout -> trajectory -> credit -> loss -> update``, with
``store``, ``sandbox``, ``proxy`` and ``tools`` as services beside it.
"""

__version__ = "0.1.0"

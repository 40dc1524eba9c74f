"""arborl: reinforcement learning for multi-turn, tool-calling LLM agents.

Data flows one way: ``env -> rollout -> trajectory -> credit -> loss -> update``, with
``store``, ``sandbox``, ``proxy`` and ``tools`` as services beside it.

For notebooks and scripts: ``from arborl import load_config, train`` (see :mod:`arborl.api`;
both import torch only when called, so ``import arborl`` stays light).
"""

__version__ = "0.1.0"

# The name ``arborl.train`` is the function; the package of the same name stays importable as
# ``from arborl.train.pipeline import ...``. Importing the (empty) package first means no later
# submodule import rebinds the attribute to it.
import arborl.train as _train_package  # noqa: E402,F401
from arborl.api import load_config, train  # noqa: E402

__all__ = ["__version__", "load_config", "train"]

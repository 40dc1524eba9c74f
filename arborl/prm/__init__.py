"""Process reward models: step scores for the ``process`` credit estimator (arborl.credit.process).

* :class:`~arborl.prm.explicit.ExplicitPRM` (``rl.credit = "prm"``, AgentPRM-style): a step scorer
  (the start policy's transformer with a linear head of one logit per named dimension) trained with
  binary cross-entropy on Monte-Carlo targets computed from the episodes in the trajectory store.
* :class:`~arborl.prm.implicit.ImplicitPRM` (``rl.credit = "implicit_prm"``, PRIME; ``"istar"``,
  iStar): a copy of the start policy whose per-token log-ratio to a reference,
  ``beta * (log pi_phi - log pi_ref)``, is the process reward, trained with cross-entropy on
  outcomes (PRIME) or a trajectory-level DPO loss over better/worse pairs of a group (iStar).

Both implement the credit-model hook (:mod:`arborl.train.credit_models`); docs/credit.md §12 says
what they compute and where they depart from the published code.
"""

from arborl.prm.explicit import DIMENSIONS, ExplicitPRM, mc_targets
from arborl.prm.implicit import ImplicitPRM

__all__ = ["DIMENSIONS", "ExplicitPRM", "ImplicitPRM", "mc_targets"]

"""Trained turn-level critics that credit estimators read (the credit-model hook, ``arborl.train.credit_models``).

* :mod:`arborl.critics.turn_ppo` — Turn-PPO's ``V(s_h)`` (a head on the policy, or a separate model).
* :mod:`arborl.critics.archer` — ArCHer's off-policy twin-Q / V critic with target networks and a
  replay buffer read back from the trajectory store.

Each is built by ``arborl.cli.CREDIT_MODELS`` under its ``rl.credit`` name.
"""

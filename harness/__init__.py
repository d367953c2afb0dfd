"""Research harness for prefill-decode allocation in agentic RL rollouts."""
from omegaconf import OmegaConf

# `${mul:a,b}` in configs (e.g. the trajectories of a sync step: batch_size x group_size).
OmegaConf.register_new_resolver("mul", lambda a, b: a * b, replace=True)

# The simulator's compiled modules, when built and current (harness/native.py).
from harness import native  # noqa: E402

native.install()

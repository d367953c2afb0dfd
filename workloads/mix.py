"""Multi-task RL: `workload=mix` draws each step's prompts from several workload families by weight.

The mix YAML pulls in whole family configs through Hydra's defaults list (`components.<name>`), so a
component is exactly `workload=<name>` and is overridden the same way
(`workload.components.swe.max_turns=50`). Components are built here, not by Hydra, with the mix's
batch and group size (the driver has one group size per run) and their own seed (seed * 1000 + i).

`schedule` lists weights by step: each entry holds from its `step` until the next entry's, so the
mix, and with it the prefill/decode balance, can move during a run. Per step the B prompts are split
by largest remainder (deterministic: counts differ from weight * B by less than one prompt). A
component with k prompts contributes the first k groups of its own batch for that step; ids are then
renumbered over the whole step, so they stay unique across components and steps.

`priors()` are the components' own, per family; a policy learns the step-0 shares from RunInfo.weights.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hydra.utils import instantiate

from harness.api import FamilyPriors
from harness.trajectory import TrajectoryScript
from workloads.base import Workload, group_id, trajectory_id


@dataclass
class MixWorkload:
    components: dict[str, Any]          # name -> a workload config with `_target_`
    schedule: list[dict[str, Any]]      # [{step: 0, weights: {name: weight}}, ...], steps increasing
    batch_size: int
    group_size: int
    name: str = "mix"
    seed: int = 0
    workloads: dict[str, Workload] = field(init=False, repr=False)

    def __post_init__(self):
        if not self.components:
            raise ValueError("workload.components is empty; list at least one family")
        self.schedule = [self._entry(i, e) for i, e in enumerate(self.schedule)]
        if not self.schedule or self.schedule[0]["step"] != 0:
            raise ValueError("workload.schedule must start with an entry at step 0")
        steps = [e["step"] for e in self.schedule]
        if steps != sorted(set(steps)):
            raise ValueError(f"workload.schedule steps {steps} must be strictly increasing")
        self.workloads = {
            name: instantiate(cfg, seed=self.seed * 1000 + i, batch_size=self.batch_size, group_size=self.group_size)
            for i, (name, cfg) in enumerate(self.components.items())}

    def _entry(self, i: int, entry) -> dict:
        where = f"workload.schedule[{i}]"
        if not isinstance(entry, Mapping) or set(entry) != {"step", "weights"}:
            raise ValueError(f"{where}={entry!r} is invalid; allowed: {{step: int, weights: {{name: weight}}}}")
        weights = {str(k): float(v) for k, v in entry["weights"].items()}
        unknown = set(weights) - set(self.components)
        if unknown:
            raise ValueError(f"{where}.weights: unknown component(s) {sorted(unknown)}; "
                             f"allowed: {sorted(self.components)}")
        if any(not (w >= 0 and math.isfinite(w)) for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(f"{where}.weights={weights} is invalid; allowed: weights >= 0, not all 0")
        return {"step": int(entry["step"]), "weights": weights}

    def weights(self, step: int) -> dict[str, float]:
        """The normalised weights in force at `step` (components left out of an entry weigh 0)."""
        entry = [e for e in self.schedule if e["step"] <= step][-1]
        total = sum(entry["weights"].values())
        return {name: entry["weights"].get(name, 0.0) / total for name in self.components}

    def priors(self) -> dict[str, FamilyPriors]:
        out: dict[str, FamilyPriors] = {}
        for name, workload in self.workloads.items():
            for family, prior in workload.priors().items():
                if out.setdefault(family, prior) != prior:
                    raise ValueError(f"workload.components.{name}: family {family!r} has other priors than an "
                                     "earlier component's; give each component its own family")
        return out

    def prompts(self, step: int) -> dict[str, int]:
        """Prompts per component at `step`: largest-remainder rounding of weight * batch_size."""
        quota = {name: w * self.batch_size for name, w in self.weights(step).items()}
        counts = {name: int(math.floor(q)) for name, q in quota.items()}
        by_remainder = sorted(quota, key=lambda n: quota[n] - counts[n], reverse=True)
        for name in by_remainder[: self.batch_size - sum(counts.values())]:
            counts[name] += 1
        return counts

    def batch(self, step: int) -> list[TrajectoryScript]:
        """The step's groups, components interleaved evenly (the i-th of k groups at position (i + 0.5) / k),
        as a shuffled multi-task dataset spreads them; not all of one task and then the other."""
        groups = []
        for name, k in self.prompts(step).items():
            scripts = self.workloads[name].batch(step)[: k * self.group_size]
            for i in range(k):
                groups.append(((i + 0.5) / k, name, scripts[i * self.group_size:(i + 1) * self.group_size]))
        out: list[TrajectoryScript] = []
        for g, (_, _, scripts) in enumerate(sorted(groups, key=lambda x: x[:2])):
            for script in scripts:
                out.append(replace(script, step=step, group_id=group_id(step, self.batch_size, g),
                                   trajectory_id=trajectory_id(step, self.batch_size, self.group_size, len(out))))
        return out

"""A representative slice of a big cluster, so that a plan's cost does not grow with the cluster.

A what-if run costs in proportion to the trajectories it simulates, and a big cluster is many copies
of the same engines under the same router. On a cluster of more than `policy.plan_engines` engines
Prorsa plans on a slice of that many: each role's engines in proportion (evenly spaced by id), the
live trajectories whose home engine is in it (those on no engine yet: the same share of them, by
id), and every count a plan samples (trajectories to start, `max_in_flight`, a step's batch) scaled
by the slice's share. A split chosen on the slice is scaled back to the cluster. This is the usual
approximation of a data-parallel fleet by one of its replicas' groups: the router spreads load
evenly, so a slice sees the cluster's per-engine load and its mix of work.

A slice may also be thinned (`weight` > 1, `policy.plan_per_engine`): it simulates one trajectory in
`weight` (`thinned`), on engines whose step times, limits and transfers count each sequence `weight`
times (ClusterConfig.weighted), and samples every count of new trajectories at that share. A plan then
costs what `plan_per_engine` trajectories per engine cost, however many the engines hold. Where a plan
scores the last end (a sync step), that end is the tail of the trajectories' chains of turns and tool
calls, which a subset drawn by id shortens (the longest of fewer): thinning keeps, per engine, the
trajectories evenly spaced in the order of their sampled chains, the longest first.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace

from harness.api import ClusterView, EngineState, Role, Route
from harness.prorsa.placement import DecodeWork
from harness.allocation import COLOCATED
from harness.prorsa.tracker import TrajectoryState
from harness.prorsa.forecast import ROUTED, FutureTrajectory
from harness.routing import PrefixTracker

_SPREAD = 2654435761   # Knuth's multiplicative hash: a trajectory on no engine joins by its id, spread


@dataclass(frozen=True)
class ClusterSlice:
    ids: tuple[int, ...]    # slice engine i is the cluster's engine ids[i]
    full: int               # the cluster's engines
    index: dict[int, int] = field(init=False, repr=False, compare=False)   # cluster engine id -> slice's

    def __post_init__(self):
        object.__setattr__(self, "index", {cid: i for i, cid in enumerate(self.ids)})

    @property
    def share(self) -> float:
        """The share of the cluster's engines simulated."""
        return len(self.ids) / self.full

    @classmethod
    def of(cls, view: ClusterView, size: int) -> ClusterSlice:
        """`size` engines of `view`, each role (counting switches under way) in proportion to its
        engines in the cluster (largest remainders; every role present keeps one), evenly spaced by id."""
        by_role: dict[Role, list[EngineState]] = {}
        for e in sorted(view.engines, key=lambda e: e.engine_id):
            by_role.setdefault(e.target_role or e.role, []).append(e)
        n = len(view.engines)
        quota = {r: max(1, len(es) * size // n) for r, es in by_role.items()}
        rest = sorted(by_role, key=lambda r: (-(len(by_role[r]) * size % n), r.value))
        for r in rest:
            if sum(quota.values()) >= size:
                break
            quota[r] += 1
        ids = []
        for r, es in by_role.items():
            step = len(es) / quota[r]
            ids += [es[int(i * step)].engine_id for i in range(quota[r])]
        return cls(tuple(sorted(ids)), n)

    def view(self, view: ClusterView) -> ClusterView:
        """The slice's engines, numbered from 0 in slice order."""
        engines = {e.engine_id: e for e in view.engines}
        return ClusterView(view.now, [replace(engines[cid], engine_id=i) for i, cid in enumerate(self.ids)])

    def keeps(self, s: TrajectoryState, prefix: PrefixTracker, routes: dict[int, Route]) -> bool:
        """Whether a live trajectory is simulated: its home engine (the decode engine of its turn under
        way, else where its KV was last decoded, else prefilled) is in the slice; with no home yet, the
        slice's share of such trajectories, by id."""
        tid = s.trajectory_id
        route = routes.get(tid) if s.phase in ROUTED else None
        home = route.decode_engine if route is not None else prefix.decode_engine.get(tid, prefix.prefill_engine.get(tid))
        if home is not None:
            return home in self.index
        return (tid * _SPREAD) % self.full < len(self.ids)

    def renumbered(self, futures: list[FutureTrajectory]) -> list[FutureTrajectory]:
        """The futures with their engines numbered as in the slice; an engine outside it is forgotten (a
        turn routed to one is routed again)."""
        out = []
        for ft in futures:
            route = ft.route
            if route is not None:
                p, d = self.index.get(route.prefill_engine), self.index.get(route.decode_engine)
                route = Route(p, d, route.priority) if p is not None and d is not None else None
            out.append(replace(ft, decode_engine=self.index.get(ft.decode_engine),
                               prefill_engine=self.index.get(ft.prefill_engine), route=route))
        return out

    def work(self, work: DecodeWork) -> DecodeWork:
        """The forecast decode work held by the slice's engines, numbered as in the slice."""
        out = DecodeWork(work.left)
        for tid, (engine_id, w) in work.of.items():
            if engine_id in self.index:
                out.of[tid] = (self.index[engine_id], w)
                out.on[self.index[engine_id]] += w
        return out


def scaled(count: int, share: float) -> int:
    """A count of trajectories at a slice's `share` of the cluster (at least one of a non-zero count)."""
    return max(1, round(count * share)) if count > 0 else 0


def cluster_split(split: int, share: float, engines: int) -> int:
    """A split of a slice (`share` of `engines`) as a split of the cluster: prefill engines in the same
    proportion."""
    if split == COLOCATED:
        return COLOCATED
    return min(max(round(split / share), 1), engines - 1)


def thinned(futures: list[FutureTrajectory], weight: int, decode_floor: float,
            stratum: Callable[[FutureTrajectory], Hashable] = lambda ft: None,
            unit: Callable[[FutureTrajectory], Hashable] = lambda ft: ft.trajectory_id) -> list[FutureTrajectory]:
    """One unit (a trajectory, or a GRPO group kept whole: `unit`) in `weight` of each `stratum` (an
    engine): round(n / weight) of its n units, at least one, evenly spaced in the order of their longest
    sampled chain (FutureTrajectory.chain_s), the longest first, so each stratum keeps its share of the
    load and its longest chain. In the order given."""
    chains: dict[Hashable, dict[Hashable, float]] = {}
    for ft in futures:
        units = chains.setdefault(stratum(ft), {})
        key = unit(ft)
        units[key] = max(units.get(key, 0.0), ft.chain_s(decode_floor))
    picked = set()
    for units in chains.values():
        order = sorted(units, key=lambda u: (-units[u], u))
        count = max(1, round(len(order) / weight))
        picked.update(order[j * len(order) // count] for j in range(count))
    return [ft for ft in futures if unit(ft) in picked]


def home(ft: FutureTrajectory) -> int | None:
    """The engine a live trajectory's future lives on: its turn under way's decode engine, else where its
    KV is (None: nowhere yet)."""
    if ft.route is not None:
        return ft.route.decode_engine
    return ft.decode_engine if ft.decode_engine is not None else ft.prefill_engine

"""The contracts between the rollout driver, the policies and the backends.

Data flows one way: workload -> RolloutDriver -> Policy -> Backend -> lifecycle events.
The same Policy and RolloutDriver objects run on the simulator and on real engines, so
everything a policy may look at is in `ClusterView` and `LifecycleEvent`: the present and
the past, never a trajectory's future (the oracle baseline is the one named exception).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Callable, ClassVar, Protocol

if TYPE_CHECKING:
    import pandas as pd


class Role(str, enum.Enum):
    """What an engine serves. A role is a routing decision plus the engine's parallelism."""

    COLOCATED = "colocated"
    PREFILL = "prefill"
    DECODE = "decode"


class EventKind(str, enum.Enum):
    TRAJECTORY_START = "trajectory_start"
    TURN_READY = "turn_ready"          # the turn's prompt is complete
    PREFILL_START = "prefill_start"
    PREFILL_END = "prefill_end"
    TRANSFER_END = "transfer_end"      # KV is on the decode engine
    DECODE_START = "decode_start"
    FIRST_TOKEN = "first_token"
    DECODE_END = "decode_end"
    TOOL_END = "tool_end"
    TRAJECTORY_END = "trajectory_end"
    PREEMPTED = "preempted"            # KV dropped; the tokens will be recomputed
    ROLE_SWITCH_START = "role_switch_start"
    ROLE_SWITCH_END = "role_switch_end"
    PREFIX_CACHE_CLEARED = "prefix_cache_cleared"   # an engine's cached prefixes are gone (a switch reloaded
                                                    # or reset it): none of its trajectories' KV is there now
    ENGINE_FAILED = "engine_failed"
    ENGINE_RECOVERED = "engine_recovered"   # a failed engine is back, in its role
    DECODE_MIGRATED = "decode_migrated"     # a turn's decode moved to engine_id (cluster.migrate_decodes_on_switch)


@dataclass(frozen=True)
class LifecycleEvent:
    kind: EventKind
    t: float
    trajectory_id: int = -1
    turn: int = -1
    engine_id: int = -1
    tokens: int = 0                    # see the table below
    extra_tokens: int = 0
    detail: str = ""


# What `tokens` / `extra_tokens` mean for each event kind:
#   PREFILL_START  tokens: prompt tokens served from the engine's prefix cache
#   PREFILL_END    tokens: tokens prefilled by this attempt
#   TRANSFER_END   tokens: KV tokens moved to the decode engine
#   DECODE_END     tokens: output tokens of the turn
#   PREEMPTED      tokens: KV tokens dropped, to be recomputed;
#                  extra_tokens: tokens the interrupted prefill attempt had computed
#   DECODE_MIGRATED tokens: KV tokens shipped to the new decode engine (0: the leg had not started);
#                  extra_tokens: output tokens generated before the move


@dataclass
class TurnRequest:
    """One turn of one trajectory, as the router sees it: what is known when its prompt is ready.

    `max_output_tokens` is the cap a real request carries; the true output length is known only
    to the workload script and the backend that replays it.
    """

    trajectory_id: int
    group_id: int
    turn: int
    family: str
    prompt_tokens: int                 # full context of this turn's prompt
    appended_tokens: int               # tokens added since the previous turn's prompt
    max_output_tokens: int
    output_tokens: int = field(repr=False, default=0)   # scripted length, read by backends only
    t_ready: float = 0.0


@dataclass(frozen=True)
class Route:
    """Where a turn runs: one engine (colocated) or a prefill engine then a decode engine, and its place in
    the engines' waiting queues: lower `priority` is admitted first, first come first served among equals
    (vLLM's `--scheduling-policy priority` order; 0 everywhere is plain FCFS)."""

    prefill_engine: int
    decode_engine: int
    priority: float = 0.0

    @property
    def disaggregated(self) -> bool:
        return self.prefill_engine != self.decode_engine


@dataclass
class EngineState:
    """What a router can observe of one engine right now."""

    engine_id: int
    role: Role
    available: bool                    # False while switching roles or failed
    gpus: int
    waiting_requests: int
    waiting_prefill_tokens: int
    running_requests: int
    decoding_requests: int
    kv_used_tokens: int
    kv_capacity_tokens: int
    queued_kv_tokens: int = 0          # prompt tokens of legs assigned here but not yet admitted
    inbound_requests: int = 0          # decode legs routed here whose prefill is still running
    target_role: Role | None = None    # set while a role switch is in progress
    # the role whose parallelism the engine was launched with: kv_both and drain switches keep it, a
    # reshard reloads the engine with its new role's (None: the present role's)
    launched_as: Role | None = None


@dataclass
class ClusterView:
    now: float
    engines: list[EngineState]

    def with_role(self, role: Role) -> list[EngineState]:
        return [e for e in self.engines if e.available and e.role == role]

    def switching(self) -> bool:
        """Some engine is changing roles."""
        return any(e.target_role is not None for e in self.engines)

    def launched_roles(self) -> list[Role]:
        """Per engine, the role whose parallelism it runs with (its present role when not reported)."""
        return [e.launched_as or e.role for e in self.engines]

    _generated: ClassVar[dict[int, int]] = {}   # a backend that knows sets its own (views are built per route)

    def generated_tokens(self) -> dict[int, int]:
        """Trajectory id -> output tokens its turn now decoding has generated so far, as a client that
        streams the responses counts them ({} where the backend does not say)."""
        return self._generated


@dataclass(frozen=True)
class LogNormalPrior:
    """A positive quantity's prior belief: lognormal with this median and log-space sigma, cut at the
    recipe's cap `high`. A mixture (e.g. fast local tools and slow test suites) keeps its components
    in `parts` (weight, prior); `median` and `sigma` then stand for the whole as one lognormal."""

    median: float
    sigma: float
    high: float = math.inf
    parts: tuple[tuple[float, LogNormalPrior], ...] = ()

    def quantiles(self, n: int) -> list[float]:
        """`n` evenly spaced quantile points, sorted (a mixture: each part's share of them)."""
        if self.parts:
            total = sum(w for w, _ in self.parts)
            points = [x for w, p in self.parts for x in p.quantiles(max(1, round(n * w / total)))]
            return sorted(points)
        normal = NormalDist()
        return [min(self.median * math.exp(self.sigma * normal.inv_cdf((i + 0.5) / n)), self.high)
                for i in range(n)]


@dataclass(frozen=True)
class ExampleTrajectory:
    """A recorded trajectory's shape (a trace's), without its identity. A plan may draw whole
    trajectories from these and keep every link between one trajectory's turns that per-quantity
    distributions lose: its turn count with its answers' lengths, a first turn that plans and a last
    one that answers, tool outputs that grow turn by turn."""

    prompt_tokens: int
    outputs: tuple[int, ...]            # per turn
    tool_outputs: tuple[int, ...]       # per tool call (after every turn but the last)
    tool_latencies: tuple[float, ...]   # per tool call


@dataclass(frozen=True)
class FamilyPriors:
    """What a workload says of one task family before any trajectory is seen (cold-start priors)."""

    prompt_tokens: LogNormalPrior        # first prompt
    output_tokens: LogNormalPrior        # per turn
    tool_output_tokens: LogNormalPrior   # per tool call
    tool_latency_s: LogNormalPrior       # per tool call
    turns: LogNormalPrior                # per trajectory
    max_turns: int                       # the recipe's turn cap
    context_cap: int                     # tokens: no turn's prompt + output exceeds it
    # The share of the variance of log output tokens that one trajectory's turns share (intraclass
    # correlation): a trajectory that has written long answers keeps writing long ones. 0: each turn
    # draws its length afresh.
    output_shared: float = 0.0
    # The correlation of a trajectory's log turn count with its own output level (the shared part
    # above): a hard task takes more turns and longer answers at once. It shapes the step's slowest
    # trajectory, which is the one with many turns and long answers. 0: the two are independent.
    turns_output_corr: float = 0.0
    # The correlation of the log turn counts of the samples of one prompt (a GRPO group): a hard prompt
    # is hard for all of them. 0: each sample draws its turn count afresh.
    turns_group_corr: float = 0.0
    # Recorded trajectories of the family in their GRPO groups (a trace's): where there are some, plans
    # draw new trajectories, and the rest of live ones, from them rather than from the distributions
    # above. Empty for generators, whose distributions are exact.
    examples: tuple[tuple[ExampleTrajectory, ...], ...] = ()


@dataclass(frozen=True)
class RunInfo:
    """What a policy is told when a run starts: the RL mode and the workload's priors, never its scripts
    (a trace's recorded trajectories may be among the priors, as a population without ids or order:
    never which trajectory runs when).

    Built by the experiment from the mode config and `Workload.priors()`.
    """

    mode: str                            # sync | async
    trajectories_per_step: int           # batch_size * group_size
    max_in_flight: int                   # async: the concurrency cap; sync: trajectories_per_step
    num_steps: int
    priors: dict[str, FamilyPriors]      # family -> priors (every family the workload can draw)
    # per step, family -> share of its batch: the task mix the trainer's data loader declares (a
    # curriculum is configuration, known before the run), never the trajectories themselves
    step_weights: list[dict[str, float]] = field(default_factory=list)
    group_size: int = 1                  # samples per prompt (a GRPO group): trajectories_per_step's factor
    staleness: int | None = None         # async: a batch starts at most this many ahead of those completed

    @property
    def weights(self) -> dict[str, float]:
        """Family -> share of trajectories at step 0 (none known: empty)."""
        return self.step_weights[0] if self.step_weights else {}

    @property
    def total_trajectories(self) -> int:
        """Every trajectory the run starts: num_steps batches of trajectories_per_step."""
        return self.num_steps * self.trajectories_per_step


class Backend(Protocol):
    """Executes: runs legs, moves KV, switches roles, keeps time, and reports lifecycle events."""

    def now(self) -> float: ...

    def call_later(self, delay_s: float, callback: Callable[[], None], observer: bool = False) -> None:
        """Run `callback` after `delay_s`; an observer's callback only reads state (sampling)."""

    def update_weights(self) -> None:
        """The trainer pushed new weights (sync: between steps; async: after each batch): engines
        flush their prefix caches when `cluster.flush_prefix_cache_on_weight_update`."""

    def set_listener(self, on_event: Callable[[LifecycleEvent], None],
                     on_returned: Callable[[TurnRequest], None]) -> None: ...

    def submit(self, request: TurnRequest, route: Route) -> None: ...

    def switch_role(self, engine_id: int, role: Role) -> None: ...

    def view(self) -> ClusterView: ...

    def run(self) -> None: ...

    def engine_timeline(self) -> list[dict]: ...

    def fork(self, root, replace: dict[int, object] | None = None):
        """A copy of the running simulation held by `root`, to run forward on its own (simulator only)."""

    plans_inline: bool   # the clock stands still while `run_plan` runs its work (the simulator)

    def run_plan(self, work: Callable[[], object], done: Callable[[object], None]) -> None:
        """Run a policy's plan (`work`) and hand its result to `done` on the backend's loop: at once in the
        simulator; in a worker thread on real engines, the loop going on meanwhile."""

    def leg_frame(self) -> pd.DataFrame | None:
        """One row per leg with the client's and the server's times (legs.parquet): real engines. None on
        the simulator, whose legs are the lifecycle itself."""

    def overhead(self) -> dict:
        """The harness's own time per leg against the server's (summary.json harness_overhead): real
        engines; asked only when `leg_frame` is not None."""

"""Structured configs: a dataclass schema for every config group, registered in Hydra's ConfigStore.

A schema says what a key is (its type, its bounds or choices, whether it may be left out); the values
stay in the YAML files under configs/ and in the components' own defaults, so no value has two sources.
`check()` validates a group's node against its schema and raises `ValueError("<key>=<value> is invalid;
allowed: ...")` on the first bad key, the one-line message run.py prints with no traceback.

Why per job and not in Hydra's composition: with a schema in a YAML's defaults list Hydra checks
types while it composes, and a multirun composes every job in the launcher's loop, where one bad
override ends the whole sweep. Checked here, inside the job, a bad job writes its error.json and the
sweep goes on (harness/sweep.py). The schemas are still in the ConfigStore (`schema/<group>/<name>`),
so Hydra and tools can read them; `tests/test_schema.py` checks that every preset under configs/
passes its schema and that every schema key is one its component takes.

What a schema cannot say stays with the component: checks across keys (tp * dp == gpus_per_engine,
a split that needs two engines), lookups (a GPU or model in the catalogue), files (a profile, a trace).
"""
from __future__ import annotations

import difflib
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Optional

from hydra.core.config_store import ConfigStore


def key(*, ge: float | None = None, gt: float | None = None, le: float | None = None,
        choices: tuple[str, ...] | None = None, nonempty: bool = False, omittable: bool = False,
        allowed: str | None = None, infinite: bool = False):
    """A schema field: bounds (ge, gt, le) for numbers, `choices` or `nonempty` for strings; `omittable`
    when a preset may leave the key out (the component's default then applies); `allowed` replaces
    the generated description of what is allowed; `infinite` lets a float be +inf (a request rate)."""
    meta = {k: v for k, v in dict(ge=ge, gt=gt, le=le, choices=choices, nonempty=nonempty, omittable=omittable,
                                  allowed=allowed, infinite=infinite).items() if v is not None and v is not False}
    return field(metadata=meta)


def target(path: str):
    """The `_target_` of a schema: the class (or factory) Hydra instantiates with the node's keys."""
    return field(default=path, metadata={"omittable": True, "target": True})


# Upper bounds beyond which a value is a mistake, not an experiment: the periodic ticks (samples, control)
# run per interval of simulated time, so a latency of 1e308 s or a sample every microsecond runs for ever.
DAY_S = 86400.0
HOUR_S = 3600.0
AT_MOST_AN_HOUR = "a number >= 0 and <= 3600 (s; an hour)"
MAX_BATCH = 65536     # prompts per step
MAX_GROUP = 1024      # samples per prompt


# --- top level -------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class RunSchema:
    """configs/config.yaml: the groups (each checked by its own schema) and the run's own keys."""
    policy: Any = key()
    workload: Any = key()
    cluster: Any = key()
    mode: Any = key()
    backend: Any = key()
    logger: Any = key()
    seed: int = key(ge=0)
    sample_interval_s: float = key(ge=0.01, le=DAY_S, allowed="a number >= 0.01 and <= 86400 (s; a day)")
    progress_interval_s: float = key(ge=0, allowed="a number >= 0 (0: a line every sample)")


# --- cluster ---------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class ParallelismSchema:
    """One role's parallelism; tp * dp must equal gpus_per_engine (checked by harness/cluster.py)."""
    tp: int = key(ge=1, omittable=True)
    dp: int = key(ge=1, omittable=True)
    ep: bool = key(omittable=True)


@dataclass(kw_only=True)
class RolesParallelismSchema:
    colocated: ParallelismSchema = key()
    prefill: ParallelismSchema = key()
    decode: ParallelismSchema = key()


@dataclass(kw_only=True)
class ClusterSchema:
    """configs/cluster/*.yaml (harness/cluster.py ClusterConfig; the presets cite each value's source)."""
    name: str = key(nonempty=True)
    gpu: str = key(allowed="a GPU of configs/catalogue/gpus.yaml")
    model: str = key(allowed="a model of configs/catalogue/models.yaml")
    num_engines: int = key(ge=1)
    gpus_per_engine: int = key(ge=1)
    parallelism: RolesParallelismSchema = key()
    memory_fraction: float = key(gt=0, le=1)
    activation_reserve_bytes: float = key(ge=0)
    max_num_batched_tokens: int = key(ge=1)
    max_num_seqs: int = key(ge=1)
    kv_transfer_setup_s: float = key(ge=0, le=HOUR_S, allowed=AT_MOST_AN_HOUR)
    switch_time_s: float = key(ge=0, le=HOUR_S, allowed=AT_MOST_AN_HOUR)
    reshard_switch_time_s: float = key(ge=0, le=HOUR_S, allowed=AT_MOST_AN_HOUR)
    reset_prefix_cache_on_switch: bool = key()
    engine: str = key(choices=("vllm", "sglang"), omittable=True)
    chunked_prefill_size: int = key(ge=1, omittable=True)
    enable_mixed_chunk: bool = key(omittable=True)
    cuda_graph_max_bs: int = key(ge=0, omittable=True,
                                 allowed="an integer >= 0 (0: every decode batch runs as a CUDA graph)")
    flush_prefix_cache_on_weight_update: bool = key(omittable=True)
    prefix_cache_block_tokens: int = key(ge=1, omittable=True)   # harness/cluster.py ClusterConfig
    kv_transfer_block_tokens: int = key(ge=1, omittable=True)    # harness/cluster.py ClusterConfig
    # How an engine changes role (README, "Role switch mechanisms"):
    #   kv_both  vLLM connectors with kv_role=kv_both: nothing drains, the engine keeps its parallelism and
    #            finishes what it runs while the router sends it legs of the new role; cost: router update.
    #   drain    SGLang --enable-pd-role-switch (PR #28403): leave the router, drain to idle, reset the
    #            prefix cache, switch (switch_time_s); parallelism unchanged.
    #   reshard  stop, drain and reload with the new role's parallelism: reshard_switch_time_s when the
    #            parallelism changes (PEARL Table 3), else as drain.
    switch_mechanism: str = key(choices=("kv_both", "drain", "reshard"), omittable=True)
    router_update_s: float = key(ge=0, le=HOUR_S, omittable=True, allowed=AT_MOST_AN_HOUR)
    # kv_both only: when an engine becomes a prefill engine, each decode it runs moves to the decode
    # engine with the least KV in use or promised, its KV shipped over the NIC and its output so far kept
    # (live migration as Llumnix does it, Sun et al., OSDI 2024); decode legs bound for it are re-sent.
    migrate_decodes_on_switch: bool = key(omittable=True)
    router_balance_abs_requests: int = key(ge=0, omittable=True)
    router_balance_rel: float = key(ge=1, omittable=True)
    prefill_time_scale: float = key(gt=0, omittable=True)
    decode_time_scale: float = key(gt=0, omittable=True)
    cost_model: str = key(choices=("roofline", "profiled"), omittable=True)
    # Weights and GEMM inputs in BF16 (2 bytes, the BF16 peak) or FP8 (1 byte, the GPU's FP8 peak);
    # the KV cache stays BF16 (harness/perf/catalogue.py WEIGHT_BYTES). Left out: bf16.
    weight_dtype: str = key(choices=("bf16", "fp8"), omittable=True)
    profile: Optional[str] = key(omittable=True)
    contended_profile: Optional[str] = key(omittable=True)   # engines sharing a host (harness/cluster.py)
    host_path: bool = key(omittable=True)   # each leg waits the profile's host path first (harness/cluster.py)
    perf: Optional[dict[str, Any]] = key(omittable=True, allowed="a mapping of cost-model constants")


# --- mode ------------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class ModeSchema:
    """configs/mode/*.yaml (harness/rollout.py ModeConfig)."""
    name: str = key(choices=("sync", "async", "serve"))
    num_steps: int = key(ge=1)
    max_in_flight: int = key(ge=1, omittable=True)   # async only
    staleness: int = key(ge=0, omittable=True)       # async only
    request_rate: float = key(gt=0, infinite=True, omittable=True,
                              allowed="a number > 0 or inf (requests/s; inf: all at once)")   # serve only
    max_concurrency: Optional[int] = key(ge=1, omittable=True, allowed="an integer >= 1 or null (no cap)")   # serve only


# --- backends --------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class SimBackendSchema:
    name: str = key(choices=("sim",))
    fast_forward: bool = key()
    _target_: str = target("harness.sim.backend.SimBackend.from_config")


@dataclass(kw_only=True)
class RayOptionsSchema:
    enabled: bool = key(omittable=True)
    address: Optional[str] = key(omittable=True)


@dataclass(kw_only=True)
class HTTPBackendSchema:
    """The keys both real backends take (harness/engines/base.py)."""
    # Keys removed because the cluster config owns the value (one source: harness/cluster.py).
    REMOVED: ClassVar[dict[str, str]] = {
        "switch_time_s": "the switch is priced and waited as the cluster's switch mechanism says "
                         "(cluster.switch_mechanism; kv_both: cluster.router_update_s)"}
    model: Optional[str] = key()
    vocab: int = key(ge=4)
    extra_args: list[str] = key()
    python: Optional[str] = key()
    log_dir: Optional[str] = key()
    base_port: int = key(ge=0)
    startup_timeout_s: float = key(gt=0)
    ray: RayOptionsSchema = key()
    time_scale: float = key(gt=0)
    max_retries: int = key(ge=0)
    health_interval_s: float = key(gt=0)


@dataclass(kw_only=True)
class VllmBackendSchema(HTTPBackendSchema):
    """configs/backend/vllm.yaml and vllm_cpu.yaml (harness/engines/vllm.py)."""
    name: str = key(choices=("vllm", "vllm_cpu"))
    served_model_name: str = key(nonempty=True)
    dtype: str = key(nonempty=True)
    max_model_len: int = key(ge=1)
    skip_tokenizer_init: bool = key()
    kv_connector: str = key(nonempty=True)
    kv_load_failure_policy: str = key(choices=("recompute", "fail"))
    kv_shared_dir: Optional[str] = key()
    nixl_base_port: int = key(ge=1, omittable=True)
    env: dict[str, Any] = key()
    cpu_binding: bool = key()
    cpus_per_engine: float = key(gt=0)
    gpus: bool = key()
    _target_: str = target("harness.engines.vllm.VllmBackend.from_config")


@dataclass(kw_only=True)
class SGLangBackendSchema(HTTPBackendSchema):
    """configs/backend/sglang.yaml (harness/engines/sglang.py)."""
    name: str = key(choices=("sglang",))
    transfer_backend: str = key(choices=("mooncake", "nixl", "mori", "fake"))
    bootstrap_base_port: int = key(ge=1)
    router_url: Optional[str] = key()
    urls: Optional[list[str]] = key()
    bootstrap_ports: Optional[list[int]] = key()
    _target_: str = target("harness.engines.sglang.SGLangBackend.from_config")


# --- loggers ---------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class NoLoggerSchema:
    name: str = key(choices=("none",))
    _target_: str = target("harness.wandb_logger.NoLoggerConfig")


@dataclass(kw_only=True)
class WandbLoggerSchema:
    """configs/logger/wandb.yaml (harness/wandb_logger.py WandbConfig)."""
    name: str = key(choices=("wandb",))
    mode: str = key(choices=("offline", "online", "disabled"), omittable=True)
    project: str = key(nonempty=True, omittable=True)
    entity: Optional[str] = key(omittable=True)
    group: Optional[str] = key(omittable=True)
    tags: list[str] = key(omittable=True)
    tables: bool = key(omittable=True)
    max_table_rows: int = key(ge=0, omittable=True)
    max_points: int = key(ge=2, omittable=True)
    _target_: str = target("harness.wandb_logger.WandbConfig")


# --- policies (baselines/, harness/prorsa) ---------------------------------------------------------

@dataclass(kw_only=True)
class ColocateSchema:
    _target_: str = target("baselines.colocate.Colocate")


@dataclass(kw_only=True)
class FixedPDSchema:
    num_prefill: int = key()   # in [1, cluster.num_engines - 1]: checked by baselines/base.py split_roles
    _target_: str = target("baselines.fixed_pd.FixedPD")


@dataclass(kw_only=True)
class PPDSchema(FixedPDSchema):
    _target_: str = target("baselines.ppd.PPD")


@dataclass(kw_only=True)
class ReactivePDSchema:
    num_prefill: int = key()   # as FixedPDSchema's
    control_interval_s: float = key(gt=0)
    prefill_queue_high: int = key(ge=0)
    prefill_queue_low: int = key(ge=0)
    decode_kv_high: float = key(gt=0, le=1)
    decode_kv_low: float = key(gt=0, le=1)
    min_dwell_s: float = key(ge=0)
    _target_: str = target("baselines.reactive_pd.ReactivePD")


@dataclass(kw_only=True)
class PearlSchema:
    control_interval_s: float = key(gt=0)
    hysteresis: float = key(ge=0)
    turn_overhead_s: float = key(ge=0)
    min_fit_points: int = key(ge=2)
    _target_: str = target("baselines.pearl.Pearl")


@dataclass(kw_only=True)
class OraclePDSchema:
    control_interval_s: float = key(gt=0)
    decision_interval_s: float = key(gt=0)
    allow_colocated: bool = key()
    name: str = key(nonempty=True, omittable=True)
    _target_: str = target("baselines.oracle_pd.OraclePD")


@dataclass(kw_only=True)
class PlanningModelSchema:
    """Prorsa's `policy.model` (harness/prorsa/model.py): null takes the cluster's own."""
    cost_model: Optional[str] = key(choices=("roofline", "profiled"))
    profile: Optional[str] = key(nonempty=True)
    perf: Optional[dict[str, float]] = key()
    prefill_scale: Optional[float] = key(gt=0)
    decode_scale: Optional[float] = key(gt=0)


@dataclass(kw_only=True)
class ProrsaSchema:
    """configs/policy/prorsa.yaml (harness/prorsa/policy.py; what each key does is said in the YAML)."""
    control_interval_s: float = key(gt=0)
    replan_interval_s: float = key(gt=0)
    horizon_s: float = key(gt=0)
    bins: int = key(ge=1)
    hysteresis: float = key(ge=0)
    min_dwell_s: float = key(ge=0)
    confirm_plans: int = key(ge=1)
    switch_rule: str = key(choices=("consecutive", "evidence"))
    check_samples: int = key(ge=0)
    min_observations: int = key(ge=1)
    allow_colocated: bool = key()
    max_candidates: int = key(ge=1)
    forecast: bool = key()
    switching: bool = key()
    mix_forecast: str = key(choices=("schedule", "window"))
    mix_window: int = key(ge=1)
    initial: str = key(choices=("plan", "colocated"))
    initial_samples: int = key(ge=1)
    initial_max_samples: int = key(ge=1)
    priority: str = key(choices=("fcfs", "remaining_work"))
    placement: str = key(choices=("kv_load", "forecast_work"))
    plan_latency: Any = key(allowed="model, or a number of seconds >= 0")   # checked by Prorsa (a union)
    plan_events_per_s: float = key(gt=0)
    plan_engines: int = key(ge=2)
    plan_workers: Any = key(allowed="auto, or an integer >= 1")   # checked by Prorsa (a union)
    plan_per_engine: Optional[int] = key(ge=1, allowed="an integer >= 1 or null (every trajectory)")
    model: PlanningModelSchema = key()
    priors: str = key(choices=("workload", "none"))
    seed: int = key(ge=0)
    name: str = key(nonempty=True, omittable=True)
    _target_: str = target("harness.prorsa.policy.Prorsa")


# --- workloads (workloads/) ------------------------------------------------------------------------

@dataclass(kw_only=True)
class LogNormalSchema:
    """workloads/base.py LogNormal: a median, a log spread and an optional cap."""
    median: float = key(gt=0)
    sigma: float = key(ge=0)
    high: float = key(gt=0, omittable=True)


@dataclass(kw_only=True)
class ModeComponentSchema(LogNormalSchema):
    """workloads/base.py Mode: one weighted lognormal component of a mixture."""
    name: str = key(nonempty=True)
    weight: float = key(ge=0)


@dataclass(kw_only=True)
class LatencyComponentSchema(ModeComponentSchema):
    """A tool-latency component: at most a day (a longer one only makes the periodic ticks run on)."""
    median: float = key(gt=0, le=DAY_S, allowed="a number > 0 and <= 86400 (s; a day)")
    high: float = key(gt=0, le=DAY_S, omittable=True, allowed="a number > 0 and <= 86400 (s; a day)")


@dataclass(kw_only=True)
class DriftSchema:
    output_per_step: float = key(gt=-1, omittable=True)
    turns_per_step: float = key(gt=-1, omittable=True)


@dataclass(kw_only=True)
class AgentSchema:
    """configs/workload/{search,search_long,swe,tooluse,browse,reasoning,synthetic}.yaml (workloads/agent.py)."""
    name: str = key(nonempty=True)
    family: str = key(nonempty=True)
    batch_size: int = key(ge=1, le=MAX_BATCH, allowed=f"an integer >= 1 and <= {MAX_BATCH}")
    group_size: int = key(ge=1, le=MAX_GROUP, allowed=f"an integer >= 1 and <= {MAX_GROUP}")
    context_cap: int = key(ge=1)
    max_output_tokens: int = key(ge=1)
    max_turns: int = key(ge=1)
    prompt: LogNormalSchema = key()
    turns: list[ModeComponentSchema] = key()
    output: LogNormalSchema = key()
    tool_output: LogNormalSchema = key()
    tool_latency: list[LatencyComponentSchema] = key()
    group_corr: float = key(ge=0, le=1, omittable=True)
    group_score_corr: float = key(ge=-1, le=1, omittable=True)
    turn_modes_per: str = key(choices=("sample", "group"), omittable=True)
    drift: DriftSchema = key(omittable=True)
    targets: dict[str, Any] = key(omittable=True)
    _target_: str = target("workloads.agent.AgentWorkload")


@dataclass(kw_only=True)
class RequestsSchema:
    """configs/workload/requests.yaml (workloads/requests.py): the serving benchmark's requests."""
    name: str = key(nonempty=True)
    num_requests: int = key(ge=1, le=1 << 24, allowed=f"an integer >= 1 and <= {1 << 24}")
    prompt_tokens: int = key(ge=1)
    output_tokens: int = key(ge=1)
    prompt_sigma: float = key(ge=0, omittable=True)
    output_sigma: float = key(ge=0, omittable=True)
    family: str = key(nonempty=True, omittable=True)
    _target_: str = target("workloads.requests.RequestsWorkload")


@dataclass(kw_only=True)
class MixSchema:
    """configs/workload/mix*.yaml (workloads/mix.py): each component is checked by its own schema."""
    name: str = key(nonempty=True)
    components: dict[str, Any] = key(allowed="a mapping of name -> workload config")
    schedule: list[Any] = key(allowed="a list of {step: int, weights: {name: weight}}")
    batch_size: int = key(ge=1, le=MAX_BATCH, allowed=f"an integer >= 1 and <= {MAX_BATCH}")
    group_size: int = key(ge=1, le=MAX_GROUP, allowed=f"an integer >= 1 and <= {MAX_GROUP}")
    _target_: str = target("workloads.mix.MixWorkload")


@dataclass(kw_only=True)
class TraceSchema:
    """configs/workload/trace.yaml (workloads/trace.py)."""
    name: str = key(nonempty=True)
    path: str = key(nonempty=True, allowed="a trace file (JSONL)")
    batch_size: Optional[int] = key(ge=1, allowed="an integer >= 1 or null")
    prior_path: Optional[str] = key(omittable=True, allowed="a trace file (JSONL) or null")
    _target_: str = target("workloads.trace.TraceWorkload")


# In the ConfigStore as schema/<group>/<name>: each group's presets name the schema they follow.
STORE: dict[str, dict[str, type]] = {
    "cluster": {"cluster": ClusterSchema},
    "mode": {"mode": ModeSchema},
    "backend": {"sim": SimBackendSchema, "vllm": VllmBackendSchema, "sglang": SGLangBackendSchema},
    "logger": {"none": NoLoggerSchema, "wandb": WandbLoggerSchema},
    "policy": {"colocate": ColocateSchema, "fixed_pd": FixedPDSchema, "ppd": PPDSchema,
               "reactive_pd": ReactivePDSchema, "pearl": PearlSchema, "oracle_pd": OraclePDSchema,
               "prorsa": ProrsaSchema},
    "workload": {"agent": AgentSchema, "mix": MixSchema, "trace": TraceSchema, "requests": RequestsSchema},
}
# Which schema checks a group's node: by its `_target_` (policies, workloads, backends, loggers) or, for
# the groups with one shape and no `_target_` (cluster, mode), the group's schema. A `_target_` with no
# schema here (a user's own baseline or workload) is checked against the class's signature
# (harness/experiment.py).
TARGET_SCHEMAS: dict[str, type] = {s.__dataclass_fields__["_target_"].default: s for group in STORE.values()
                                   for s in group.values() if "_target_" in s.__dataclass_fields__}
GROUP_SCHEMAS: dict[str, type] = {name: s for name, group in STORE.items() for s in group.values()
                                  if "_target_" not in s.__dataclass_fields__}


def register() -> None:
    """Puts every schema in Hydra's ConfigStore as `schema/<group>/<name>` (and the top level as
    `schema/run`); idempotent."""
    cs = ConfigStore.instance()
    cs.store(group="schema", name="run", node=RunSchema)
    for group, schemas in STORE.items():
        for name, s in schemas.items():
            cs.store(group=f"schema/{group}", name=name, node=s)


def schema_for(group: str, node: Mapping) -> type | None:
    """The schema of a group's node, or None (an unknown `_target_`)."""
    if group in GROUP_SCHEMAS:
        return GROUP_SCHEMAS[group]
    return TARGET_SCHEMAS.get(node.get("_target_")) if isinstance(node, Mapping) else None


# --- the check -------------------------------------------------------------------------------------

def check_group(group: str, node: Mapping) -> bool:
    """Checks a group's node (resolved) against its schema, a mix's components each against their own;
    False when there is no schema for it (an unknown `_target_`: the caller checks the signature)."""
    found = schema_for(group, node)
    if found is None:
        return False
    check(node, found, group)
    if found is MixSchema:
        for name, component in node["components"].items():
            where = f"{group}.components.{name}"
            inner = schema_for(group, component)
            if inner is None:
                raise ValueError(f"{where}._target_={component.get('_target_')!r} is invalid; allowed: one of "
                                 + ", ".join(t for t in TARGET_SCHEMAS if t.startswith("workloads.")))
            check(component, inner, where)
    return True


def check(node: Any, schema: type, where: str) -> None:
    """Raises ValueError naming the first key of `node` (a plain dict, resolved) that `schema` refuses:
    an unknown key, a required key left out, a value of the wrong type or out of bounds. `where` is the
    node's dotted path ("cluster", "policy", or "" for the top level)."""
    names = [f.name for f in fields(schema)]
    if not isinstance(node, Mapping):
        raise ValueError(f"{where}={node!r} is invalid; allowed: a mapping with keys {', '.join(names)}")
    dot = f"{where}." if where else ""
    hints = typing.get_type_hints(schema)
    for k, v in node.items():
        if k in getattr(schema, "REMOVED", {}):
            raise ValueError(f"{dot}{k}={v!r} is no longer a key here: {schema.REMOVED[k]}; remove it")
        if k not in names and not (isinstance(k, str) and k.startswith("_")):
            allowed = sorted(n for n in names if not n.startswith("_"))
            raise ValueError(unknown_key(f"{dot}{k}", v, allowed) if allowed else
                             f"{dot}{k}={v!r} is invalid; {node.get('_target_', where)} takes no keys")
    for f in fields(schema):
        if f.metadata.get("target"):
            continue
        if f.name not in node:
            if not f.metadata.get("omittable"):
                raise ValueError(f"{dot}{f.name}=None is invalid; allowed: a value (the key is required)")
            continue
        _check_value(node[f.name], hints[f.name], f.metadata, f"{dot}{f.name}")


def unknown_key(dotted: str, value: Any, allowed: list[str]) -> str:
    """The message for a key a node does not take (`dotted`: its full path): the keys allowed, and the
    closest of them (difflib) where one is close, as a misspelling is."""
    parent, _, key = dotted.rpartition(".")
    return f"{dotted}={value!r} is invalid;{did_you_mean(key, allowed, parent + '.' if parent else '')} allowed: " \
           f"one of {', '.join(allowed)}"


def did_you_mean(word: str, allowed: list[str], prefix: str = "") -> str:
    """' did you mean <prefix><closest>?' where one of `allowed` is close to `word` (difflib), as a
    misspelling is; '' otherwise."""
    close = difflib.get_close_matches(str(word), allowed, n=1)
    return f" did you mean {prefix}{close[0]}?" if close else ""


def check_annotated(value: Any, tp: Any, where: str) -> None:
    """A key of a component with no schema (a user's own baseline) against its constructor's annotation,
    where that is int, float, bool or str, or an Optional or list of them; any other annotation is left
    to the component."""
    if _plain(tp):
        _check_value(value, tp, {}, where)


def _plain(tp: Any) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType, list):
        return bool(args) and all(_plain(a) for a in args if a is not type(None))
    return tp in (int, float, bool, str)


def _check_value(value: Any, tp: Any, meta: Mapping, where: str) -> None:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):   # Optional[T]
        if value is None:
            return
        tp = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return
    if is_dataclass(tp):
        if not isinstance(value, Mapping):
            names = ", ".join(f.name for f in fields(tp))
            raise ValueError(f"{where}={value!r} is invalid; allowed: {meta.get('allowed') or 'a mapping with keys ' + names}")
        check(value, tp, where)
        return
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}={value!r} is invalid; allowed: {meta.get('allowed') or _describe(tp, meta)}")
        for i, item in enumerate(value):
            _check_value(item, args[0], {}, f"{where}[{i}]")
        return
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}={value!r} is invalid; allowed: {meta.get('allowed') or 'a mapping'}")
        for k, item in value.items():
            _check_value(item, args[1], {}, f"{where}.{k}")
        return
    if not _fits(value, tp, meta):
        raise ValueError(f"{where}={value!r} is invalid; allowed: {meta.get('allowed') or _describe(tp, meta)}")


def _fits(value: Any, tp: type, meta: Mapping) -> bool:
    if tp is bool:
        return isinstance(value, bool)
    if tp is str:
        return (isinstance(value, str) and (not meta.get("nonempty") or bool(value))
                and ("choices" not in meta or value in meta["choices"]))
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and (math.isfinite(value) or (meta.get("infinite") and value == math.inf)))
    else:
        raise TypeError(f"schema type {tp!r} is not supported")
    return ok and (("ge" not in meta or value >= meta["ge"]) and ("gt" not in meta or value > meta["gt"])
                   and ("le" not in meta or value <= meta["le"]))


def _describe(tp: Any, meta: Mapping) -> str:
    """What a field allows, in the words of every other message: 'an integer >= 1', 'a number > 0',
    '(0, 1]', 'true, false', 'vllm, sglang', 'a list of strings'."""
    if typing.get_origin(tp) is list:
        return f"a list of {_describe(typing.get_args(tp)[0], {}).removeprefix('a ').removeprefix('an ')}s"
    if tp is bool:
        return "true, false"
    if tp is str:
        if "choices" in meta:
            return ", ".join(meta["choices"])
        return "a non-empty string" if meta.get("nonempty") else "a string"
    noun = "an integer" if tp is int else "a number"
    low = ("gt", meta["gt"]) if "gt" in meta else ("ge", meta["ge"]) if "ge" in meta else None
    if low and "le" in meta:
        return f"{'(' if low[0] == 'gt' else '['}{_num(low[1])}, {_num(meta['le'])}]"
    if low:
        return f"{noun} {'>' if low[0] == 'gt' else '>='} {_num(low[1])}"
    return f"{noun} <= {_num(meta['le'])}" if "le" in meta else noun


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)

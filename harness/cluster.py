"""Cluster configuration: engines, their GPUs, each role's parallelism, memory and switch costs.

Built from the Hydra `cluster` group; every check names the config key and the allowed values,
so a wrong value stops the run before anything is simulated.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from harness.api import Role
from harness.perf.catalogue import GPUSpec, ModelSpec, lookup, perf_defaults
from harness.perf.roofline import Parallelism, PerfConstants


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    gpu: GPUSpec
    model: ModelSpec
    num_engines: int
    gpus_per_engine: int
    parallelism: dict[Role, Parallelism]
    perf: PerfConstants
    memory_fraction: float
    activation_reserve_bytes: float
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_transfer_setup_s: float
    switch_time_s: float
    reshard_switch_time_s: float
    reset_prefix_cache_on_switch: bool
    cost_model: str = "roofline"
    profile: str | None = None
    engine: str = "vllm"                       # step semantics: vllm (decode-first) | sglang (prefill-first)
    chunked_prefill_size: int = 8192           # sglang: prefill tokens per step per rank
    enable_mixed_chunk: bool = False           # sglang: decodes ride along a prefill step
    cuda_graph_max_bs: int = 0                 # sglang: largest decode batch per rank run as a CUDA graph (0: any)
    flush_prefix_cache_on_weight_update: bool = True   # RL frameworks flush after each weight update
    switch_mechanism: str = "reshard"          # kv_both | drain | reshard (SWITCH_MECHANISMS)
    router_update_s: float = 0.0               # kv_both: the whole cost of a switch
    router_balance_abs_requests: int = 64      # a turn leaves its prefix's engine above this many requests
    router_balance_rel: float = 1.5            # ... more than the least busy, and this many times its own
                                               # (sgl-router's cache_aware defaults; harness/routing.py Balance)

    @property
    def prefill_budget(self) -> int:
        """Prefill tokens one rank may take in a step: vLLM's token budget, SGLang's chunk size."""
        return self.chunked_prefill_size if self.engine == "sglang" else self.max_num_batched_tokens

    @property
    def num_gpus(self) -> int:
        return self.num_engines * self.gpus_per_engine


ENGINES = ("vllm", "sglang")
# How an engine changes role (README, "Role switch mechanisms"):
#   kv_both  vLLM connectors with kv_role=kv_both: nothing drains, the engine keeps its parallelism and
#            finishes what it runs while the router sends it legs of the new role; cost: router update.
#   drain    SGLang --enable-pd-role-switch (PR #28403): leave the router, drain to idle, reset the
#            prefix cache, switch (switch_time_s); parallelism unchanged.
#   reshard  stop, drain and reload with the new role's parallelism: reshard_switch_time_s when the
#            parallelism changes (PEARL Table 3), else as drain.
SWITCH_MECHANISMS = ("kv_both", "drain", "reshard")


def _require(cond: bool, key: str, value: Any, allowed: str) -> None:
    if not cond:
        raise ValueError(f"cluster.{key}={value!r} is invalid; allowed: {allowed}")


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """A finite int or float (not a bool, not a string that looks like one)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# Cost-model constants that divide a peak rate (the rest are seconds, >= 0). Only > 0: a calibration
# against a nominal rate (harness/perf/calibrate.py) may fit a share above 1.
_EFFICIENCIES = ("gemm_mfu", "attn_mfu", "mem_efficiency", "nic_efficiency")


def cluster_from_config(c: dict) -> ClusterConfig:
    c = dict(c)
    known = {f.name for f in fields(ClusterConfig)}
    for key in c:
        _require(key in known, key, c[key], "one of " + ", ".join(sorted(known)))
    required = [f.name for f in fields(ClusterConfig) if f.name not in _OPTIONAL + ("cost_model", "profile", "perf")]
    for key in required:
        _require(key in c, key, None, "a value (the key is required)")
    _require(isinstance(c["name"], str) and bool(c["name"]), "name", c["name"], "a non-empty string")
    gpu = lookup("gpu", c["gpu"], "cluster.gpu")
    model = lookup("model", c["model"], "cluster.model")
    for key in ("num_engines", "gpus_per_engine", "max_num_batched_tokens", "max_num_seqs"):
        _require(is_int(c[key]) and c[key] >= 1, key, c[key], "an integer >= 1")
    _require(is_number(c["memory_fraction"]) and 0 < c["memory_fraction"] <= 1, "memory_fraction",
             c["memory_fraction"], "(0, 1]")
    for key in ("activation_reserve_bytes", "kv_transfer_setup_s", "switch_time_s", "reshard_switch_time_s"):
        _require(is_number(c[key]) and c[key] >= 0, key, c[key], "a number >= 0")
    _require(isinstance(c["reset_prefix_cache_on_switch"], bool), "reset_prefix_cache_on_switch",
             c["reset_prefix_cache_on_switch"], "true, false")
    _require(c.get("engine", "vllm") in ENGINES, "engine", c.get("engine"), ", ".join(ENGINES))
    _require(c.get("switch_mechanism", "reshard") in SWITCH_MECHANISMS, "switch_mechanism",
             c.get("switch_mechanism"), ", ".join(SWITCH_MECHANISMS))
    for key in ("chunked_prefill_size",):
        if key in c:
            _require(is_int(c[key]) and c[key] >= 1, key, c[key], "an integer >= 1")
    if "cuda_graph_max_bs" in c:
        _require(is_int(c["cuda_graph_max_bs"]) and c["cuda_graph_max_bs"] >= 0, "cuda_graph_max_bs",
                 c["cuda_graph_max_bs"], "an integer >= 0 (0: every decode batch runs as a CUDA graph)")
    for key in ("enable_mixed_chunk", "flush_prefix_cache_on_weight_update"):
        if key in c:
            _require(isinstance(c[key], bool), key, c[key], "true, false")
    if "router_update_s" in c:
        _require(is_number(c["router_update_s"]) and c["router_update_s"] >= 0, "router_update_s",
                 c["router_update_s"], "a number >= 0")
    if "router_balance_abs_requests" in c:
        _require(is_int(c["router_balance_abs_requests"]) and c["router_balance_abs_requests"] >= 0,
                 "router_balance_abs_requests", c["router_balance_abs_requests"], "an integer >= 0")
    if "router_balance_rel" in c:
        _require(is_number(c["router_balance_rel"]) and c["router_balance_rel"] >= 1, "router_balance_rel",
                 c["router_balance_rel"], "a number >= 1")
    _require(c.get("cost_model", "roofline") in ("roofline", "profiled"), "cost_model",
             c.get("cost_model"), "roofline, profiled")
    if c.get("cost_model") == "profiled":
        _require(bool(c.get("profile")), "profile", c.get("profile"), "a profile file path")
        _require(Path(str(c["profile"])).is_file(), "profile", c["profile"], "an existing profile file "
                 "(python -m harness.perf.calibrate writes one)")
    par = {}
    roles = {r.value: r for r in Role}
    _require(isinstance(c["parallelism"], Mapping), "parallelism", c["parallelism"],
             "a mapping of role -> {tp, dp, ep}")
    for role_name, p in dict(c["parallelism"]).items():
        _require(role_name in roles, f"parallelism.{role_name}", role_name, ", ".join(roles))
        _require(isinstance(p, Mapping), f"parallelism.{role_name}", p, "a mapping with keys tp, dp, ep")
        p = dict(p)
        for key in p:
            _require(key in ("tp", "dp", "ep"), f"parallelism.{role_name}.{key}", p[key], "tp, dp, ep")
        for key in ("tp", "dp"):
            _require(is_int(p.get(key, 1)), f"parallelism.{role_name}.{key}", p.get(key), "an integer >= 1")
        _require(isinstance(p.get("ep", False), bool), f"parallelism.{role_name}.ep", p.get("ep"), "true, false")
        pp = Parallelism(tp=p.get("tp", 1), dp=p.get("dp", 1), ep=p.get("ep", False))
        _require(pp.tp >= 1 and pp.dp >= 1, f"parallelism.{role_name}", p, "tp >= 1 and dp >= 1")
        _require(pp.gpus == c["gpus_per_engine"], f"parallelism.{role_name}", p,
                 f"tp*dp == gpus_per_engine ({c['gpus_per_engine']})")
        _require(not pp.ep or model.moe is not None, f"parallelism.{role_name}.ep", True,
                 f"false for the dense model {model.name}")
        par[roles[role_name]] = pp
    for r in Role:
        _require(r in par, f"parallelism.{r.value}", None, "a {tp, dp, ep} entry for every role")
    perf = dict(perf_defaults())
    _require(isinstance(c.get("perf") or {}, Mapping), "perf", c.get("perf"), "a mapping of cost-model constants")
    for key, v in dict(c.get("perf") or {}).items():
        _require(key in perf, f"perf.{key}", v, ", ".join(perf))
        if key in _EFFICIENCIES:
            _require(is_number(v) and v > 0, f"perf.{key}", v, "a number > 0")
        else:
            _require(is_number(v) and v >= 0, f"perf.{key}", v, "a number >= 0")
        perf[key] = v
    return ClusterConfig(
        name=c["name"], gpu=gpu, model=model, num_engines=c["num_engines"],
        gpus_per_engine=c["gpus_per_engine"], parallelism=par, perf=PerfConstants(**perf),
        memory_fraction=c["memory_fraction"], activation_reserve_bytes=c["activation_reserve_bytes"],
        max_num_batched_tokens=c["max_num_batched_tokens"], max_num_seqs=c["max_num_seqs"],
        kv_transfer_setup_s=c["kv_transfer_setup_s"], switch_time_s=c["switch_time_s"],
        reshard_switch_time_s=c["reshard_switch_time_s"],
        reset_prefix_cache_on_switch=bool(c["reset_prefix_cache_on_switch"]),
        cost_model=c.get("cost_model", "roofline"), profile=c.get("profile"),
        **{k: c[k] for k in _OPTIONAL if k in c})


# Keys with a default in ClusterConfig (presets set them explicitly, with their sources).
_OPTIONAL = ("engine", "chunked_prefill_size", "enable_mixed_chunk", "cuda_graph_max_bs",
             "flush_prefix_cache_on_weight_update", "switch_mechanism", "router_update_s",
             "router_balance_abs_requests", "router_balance_rel")


def cost_model(cluster: ClusterConfig, role: Role):
    """The step-time model of an engine launched for `role`."""
    return parallel_cost_model(cluster, cluster.parallelism[role])


def parallel_cost_model(cluster: ClusterConfig, par: Parallelism):
    """The step-time model of an engine with parallelism `par`: roofline, or fitted to a profile
    (`cluster.profile`)."""
    from harness.perf.profiled import ProfiledCostModel
    from harness.perf.roofline import RooflineCostModel
    if cluster.cost_model == "profiled":
        return ProfiledCostModel.from_file(cluster.profile, cluster.model, cluster.gpu, cluster.perf, par)
    return RooflineCostModel(cluster.model, cluster.gpu, cluster.perf, par)

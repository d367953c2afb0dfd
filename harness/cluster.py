"""Cluster configuration: engines, their GPUs, each role's parallelism, memory and switch costs.

Built from the Hydra `cluster` group; every check names the config key and the allowed values,
so a wrong value stops the run before anything is simulated.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
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

    @property
    def num_gpus(self) -> int:
        return self.num_engines * self.gpus_per_engine


def _require(cond: bool, key: str, value: Any, allowed: str) -> None:
    if not cond:
        raise ValueError(f"cluster.{key}={value!r} is invalid; allowed: {allowed}")


def cluster_from_config(c: dict) -> ClusterConfig:
    c = dict(c)
    known = {f.name for f in fields(ClusterConfig)}
    for key in c:
        _require(key in known, key, c[key], "one of " + ", ".join(sorted(known)))
    gpu = lookup("gpu", c["gpu"], "cluster.gpu")
    model = lookup("model", c["model"], "cluster.model")
    for key in ("num_engines", "gpus_per_engine", "max_num_batched_tokens", "max_num_seqs"):
        _require(isinstance(c[key], int) and c[key] >= 1, key, c[key], "an integer >= 1")
    _require(0 < c["memory_fraction"] <= 1, "memory_fraction", c["memory_fraction"], "(0, 1]")
    for key in ("activation_reserve_bytes", "kv_transfer_setup_s", "switch_time_s", "reshard_switch_time_s"):
        _require(c[key] >= 0, key, c[key], "a number >= 0")
    _require(c.get("cost_model", "roofline") in ("roofline", "profiled"), "cost_model",
             c.get("cost_model"), "roofline, profiled")
    if c.get("cost_model") == "profiled":
        _require(bool(c.get("profile")), "profile", c.get("profile"), "a profile file path")
    par = {}
    roles = {r.value: r for r in Role}
    for role_name, p in dict(c["parallelism"]).items():
        _require(role_name in roles, f"parallelism.{role_name}", role_name, ", ".join(roles))
        p = dict(p)
        for key in p:
            _require(key in ("tp", "dp", "ep"), f"parallelism.{role_name}.{key}", p[key], "tp, dp, ep")
        pp = Parallelism(tp=int(p.get("tp", 1)), dp=int(p.get("dp", 1)), ep=bool(p.get("ep", False)))
        _require(pp.tp >= 1 and pp.dp >= 1, f"parallelism.{role_name}", p, "tp >= 1 and dp >= 1")
        _require(pp.gpus == c["gpus_per_engine"], f"parallelism.{role_name}", p,
                 f"tp*dp == gpus_per_engine ({c['gpus_per_engine']})")
        _require(not pp.ep or model.moe is not None, f"parallelism.{role_name}.ep", True,
                 f"false for the dense model {model.name}")
        par[roles[role_name]] = pp
    for r in Role:
        _require(r in par, f"parallelism.{r.value}", None, "a {tp, dp, ep} entry for every role")
    perf = dict(perf_defaults())
    for key, v in dict(c.get("perf") or {}).items():
        _require(key in perf, f"perf.{key}", v, ", ".join(perf))
        perf[key] = v
    return ClusterConfig(
        name=c["name"], gpu=gpu, model=model, num_engines=c["num_engines"],
        gpus_per_engine=c["gpus_per_engine"], parallelism=par, perf=PerfConstants(**perf),
        memory_fraction=c["memory_fraction"], activation_reserve_bytes=c["activation_reserve_bytes"],
        max_num_batched_tokens=c["max_num_batched_tokens"], max_num_seqs=c["max_num_seqs"],
        kv_transfer_setup_s=c["kv_transfer_setup_s"], switch_time_s=c["switch_time_s"],
        reshard_switch_time_s=c["reshard_switch_time_s"],
        reset_prefix_cache_on_switch=bool(c["reset_prefix_cache_on_switch"]),
        cost_model=c.get("cost_model", "roofline"), profile=c.get("profile"))


def cost_model(cluster: ClusterConfig, role: Role):
    """The step-time model of an engine in `role`: roofline, or fitted to a profile (`cluster.profile`)."""
    from harness.perf.profiled import ProfiledCostModel
    from harness.perf.roofline import RooflineCostModel
    par = cluster.parallelism[role]
    if cluster.cost_model == "profiled":
        return ProfiledCostModel.from_file(cluster.profile, cluster.model, cluster.gpu, cluster.perf, par)
    return RooflineCostModel(cluster.model, cluster.gpu, cluster.perf, par)

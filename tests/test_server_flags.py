"""The real servers' command lines come from the cluster config (no server is started here).

For every cluster preset in configs/cluster/ and every role, the vLLM and SGLang command lines carry the
cluster's TP, DP, EP, token budget and request cap, each flag once; DP 1 gives no DP flag. The switch
a real backend performs is the cluster's mechanism, and a value the cluster owns cannot be set twice.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.api import Role
from harness.engines.vllm import (VllmBackend, backend_kwargs, vllm_argv, vllm_cluster_flags, vllm_server_specs,
                                     vllm_switch_wait_s)
from harness.engines.sglang import (SGLangBackend, check_sglang_cluster, sglang_argv, sglang_cluster_flags,
                                    sglang_switch_relaunches)
from harness.schema import check_group
from tests.conftest import CONFIGS, cluster_of, load_config

PRESETS = sorted(p.stem for p in Path(CONFIGS, "cluster").glob("*.yaml"))
ROLES = list(Role)
DP_FLAGS = {"--data-parallel-size", "-dp", "--dp-size", "--dp", "--enable-dp-attention"}


def vllm_cfg(*overrides: str) -> dict:
    cfg = load_config(["backend=vllm", "backend.model=/models/m", *overrides])
    return OmegaConf.to_container(cfg.backend, resolve=True)


def sglang_cfg(*overrides: str) -> dict:
    cfg = load_config(["backend=sglang", "backend.model=/models/m", *overrides])
    return OmegaConf.to_container(cfg.backend, resolve=True)


def value(argv: list[str], flag: str) -> str | None:
    """The value after `flag`; None when absent; fails when the flag appears more than once."""
    assert argv.count(flag) <= 1, f"{flag} appears {argv.count(flag)} times"
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_presets_found():
    assert {"cpu_small", "dense_h100", "dense8_h100", "moe_h200", "moe_h200_sglang"} <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.value)
def test_vllm_command_line_carries_the_cluster(preset, role):
    cluster = cluster_of([f"cluster={preset}"])
    par = cluster.parallelism[role]
    argv = vllm_argv(vllm_cfg(f"cluster={preset}"), cluster, role)
    assert value(argv, "--tensor-parallel-size") == str(par.tp)
    assert value(argv, "--data-parallel-size") == (str(par.dp) if par.dp > 1 else None)
    assert argv.count("--enable-expert-parallel") == int(par.ep)
    assert value(argv, "--max-num-batched-tokens") == str(cluster.max_num_batched_tokens)
    assert value(argv, "--max-num-seqs") == str(cluster.max_num_seqs)
    if par.dp == 1:
        assert not DP_FLAGS & set(argv)
    assert argv[-len(vllm_cluster_flags(cluster, role)):] == vllm_cluster_flags(cluster, role)   # extra_args: []


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.value)
def test_sglang_command_line_carries_the_cluster(preset, role):
    cluster = cluster_of([f"cluster={preset}"])
    par = cluster.parallelism[role]
    argv = sglang_argv(sglang_cfg(f"cluster={preset}"), cluster, role, 9000)
    gpus = par.tp * par.dp
    assert value(argv, "--tp-size") == str(gpus) == str(cluster.gpus_per_engine)
    assert value(argv, "--dp-size") == (str(par.dp) if par.dp > 1 else None)
    assert argv.count("--enable-dp-attention") == int(par.dp > 1)
    assert value(argv, "--ep-size") == (str(gpus) if par.ep else None)
    assert value(argv, "--chunked-prefill-size") == str(cluster.chunked_prefill_size * par.dp)
    assert value(argv, "--max-running-requests") == str(cluster.max_num_seqs * par.dp)
    assert argv.count("--enable-mixed-chunk") == int(cluster.enable_mixed_chunk)
    assert value(argv, "--cuda-graph-max-bs") == (str(cluster.cuda_graph_max_bs) if cluster.cuda_graph_max_bs else None)
    if par.dp == 1:
        assert not DP_FLAGS & set(argv)
    in_place = role != Role.COLOCATED and par.dp == 1 and not par.ep
    assert argv.count("--enable-pd-role-switch") == int(in_place)


def test_moe_h200_dp4_ep4_reaches_both_engines():
    """The case that was silently dropped: decode and colocated DP4 attention + EP4, prefill TP4."""
    vllm = cluster_of(["cluster=moe_h200"])
    assert vllm_cluster_flags(vllm, Role.DECODE) == [
        "--tensor-parallel-size", "1", "--data-parallel-size", "4", "--enable-expert-parallel",
        "--max-num-batched-tokens", "8192", "--max-num-seqs", "256"]
    assert vllm_cluster_flags(vllm, Role.COLOCATED) == vllm_cluster_flags(vllm, Role.DECODE)
    assert vllm_cluster_flags(vllm, Role.PREFILL) == [
        "--tensor-parallel-size", "4", "--max-num-batched-tokens", "8192", "--max-num-seqs", "256"]
    sglang = cluster_of(["cluster=moe_h200_sglang"])
    assert sglang_cluster_flags(sglang, Role.DECODE) == [
        "--tp-size", "4", "--dp-size", "4", "--enable-dp-attention", "--ep-size", "4",
        "--chunked-prefill-size", "32768", "--max-running-requests", "1024"]
    assert sglang_cluster_flags(sglang, Role.PREFILL) == [
        "--tp-size", "4", "--chunked-prefill-size", "8192", "--max-running-requests", "256"]
    overridden = cluster_of(["cluster=moe_h200_sglang", "cluster.enable_mixed_chunk=true",
                             "cluster.cuda_graph_max_bs=64"])
    flags = sglang_cluster_flags(overridden, Role.DECODE)
    assert "--enable-mixed-chunk" in flags and value(flags, "--cuda-graph-max-bs") == "64"


def test_dense_clusters_carry_no_dp_flags():
    for preset in ("dense_h100", "dense8_h100", "cpu_small"):
        cluster = cluster_of([f"cluster={preset}"])
        for role in Role:
            assert not DP_FLAGS & set(vllm_argv(vllm_cfg(), cluster, role)), (preset, role)
            assert not DP_FLAGS & set(sglang_argv(sglang_cfg(), cluster, role, 9000)), (preset, role)
            assert "--enable-expert-parallel" not in vllm_argv(vllm_cfg(), cluster, role)
            assert "--ep-size" not in sglang_argv(sglang_cfg(), cluster, role, 9000)


def test_engine_specs_follow_each_engines_role(tmp_path):
    """vllm_server_specs: engine i gets its initial role's parallelism, GPUs from the cluster, and NIXL
    side-channel ports spaced by the DP size (each DP rank listens on base + its rank)."""
    cluster = cluster_of(["cluster=moe_h200", "cluster.switch_mechanism=kv_both"])
    roles = [Role.PREFILL] * 3 + [Role.DECODE] * 5
    cfg = {**vllm_cfg("cluster=moe_h200"), "kv_shared_dir": str(tmp_path), "log_dir": str(tmp_path)}
    specs, _ = vllm_server_specs(cfg, cluster, roles)
    assert [value(s.argv, "--data-parallel-size") for s in specs] == [None] * 3 + ["4"] * 5
    assert [value(s.argv, "--tensor-parallel-size") for s in specs] == ["4"] * 3 + ["1"] * 5
    assert {s.num_gpus for s in specs} == {4.0}
    assert [int(s.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for s in specs] == [5600 + 4 * i for i in range(8)]


def test_cpu_engine_test_config_sets_the_budget_once():
    """The engine tests' servers (vllm_cpu + cpu_small): the budget comes from the cluster only."""
    cfg = OmegaConf.to_container(load_config(["+experiment=vllm_cpu_search"]).backend, resolve=True)
    argv = vllm_argv({**cfg, "model": "/models/tiny", "kv_shared_dir": "/tmp/kv"}, cluster_of(["cluster=cpu_small"]))
    assert value(argv, "--max-num-batched-tokens") == "4096" and value(argv, "--max-num-seqs") == "128"
    assert "--no-enable-chunked-prefill" in argv


@pytest.mark.parametrize("extra, key", [
    (["--max-num-batched-tokens", "4096"], "cluster.max_num_batched_tokens"),
    (["--max-num-seqs=64"], "cluster.max_num_seqs"),
    (["-tp", "2"], "cluster.parallelism.decode.tp"),
    (["--data-parallel-size", "2"], "cluster.parallelism.decode.dp"),
    (["--enable-expert-parallel"], "cluster.parallelism.decode.ep"),
])
def test_vllm_extra_args_cannot_repeat_a_cluster_value(extra, key):
    with pytest.raises(ValueError, match=f"comes from {key}; set {key} instead"):
        vllm_argv({**vllm_cfg(), "extra_args": extra}, cluster_of(["cluster=dense_h100"]), Role.DECODE)


@pytest.mark.parametrize("extra, key", [
    (["--tp", "2"], "cluster.parallelism.prefill.tp"),
    (["--enable-dp-attention"], "cluster.parallelism.prefill.dp"),
    (["--chunked-prefill-size", "4096"], "cluster.chunked_prefill_size"),
    (["--cuda-graph-max-bs", "8"], "cluster.cuda_graph_max_bs"),
])
def test_sglang_extra_args_cannot_repeat_a_cluster_value(extra, key):
    with pytest.raises(ValueError, match=f"comes from {key}; set {key} instead"):
        sglang_argv({**sglang_cfg(), "extra_args": extra}, cluster_of(["cluster=dense_h100"]), Role.PREFILL, 9000)


def test_vllm_refuses_a_budget_it_would_refuse():
    cfg = {**vllm_cfg(), "extra_args": ["--no-enable-chunked-prefill"], "max_model_len": 32768}
    with pytest.raises(ValueError, match=r"cluster.max_num_batched_tokens=8192 is invalid .* >= backend.max_model_len"):
        vllm_argv(cfg, cluster_of(["cluster=dense_h100"]))
    with pytest.raises(ValueError, match=r"cluster.max_num_batched_tokens=128 is invalid for vLLM; allowed: >= "
                                         r"cluster.max_num_seqs \(256\)"):
        vllm_argv(vllm_cfg(), cluster_of(["cluster=dense_h100", "cluster.max_num_batched_tokens=128"]))
    with pytest.raises(ValueError, match="backend.model='\\?\\?\\?' is invalid"):
        vllm_argv({**vllm_cfg(), "model": "???"}, cluster_of(["cluster=dense_h100"]))


# --- the switch: the cluster's mechanism and time -----------------------------------------------------
def test_vllm_switch_waits_the_clusters_kv_both_time():
    assert vllm_switch_wait_s(cluster_of(["cluster=cpu_small"])) == 0.0
    cluster = cluster_of(["cluster=dense_h100", "cluster.switch_mechanism=kv_both", "cluster.router_update_s=0.25"])
    assert vllm_switch_wait_s(cluster) == 0.25
    assert backend_kwargs(vllm_cfg(), cluster)["switch_wait_s"] == 0.25


@pytest.mark.parametrize("preset, mechanism", [("dense_h100", "reshard"), ("moe_h200", "reshard"),
                                               ("cpu_small", "drain")])
def test_vllm_refuses_another_switch_mechanism(preset, mechanism):
    cluster = cluster_of([f"cluster={preset}", f"cluster.switch_mechanism={mechanism}"])
    with pytest.raises(ValueError, match=f"cluster.switch_mechanism='{mechanism}' is invalid for the vLLM backend"
                                         ".*allowed: kv_both"):
        vllm_switch_wait_s(cluster)
    with pytest.raises(ValueError, match="cluster.switch_mechanism"):     # before any server starts
        VllmBackend.from_config(cluster, [Role.COLOCATED] * cluster.num_engines, **vllm_cfg())


def test_vllm_refuses_sglang_step_semantics():
    cluster = cluster_of(["cluster=cpu_small", "cluster.engine=sglang"])
    with pytest.raises(ValueError, match="cluster.engine='sglang' is invalid for the vLLM backend"):
        vllm_switch_wait_s(cluster)


def test_vllm_refuses_decode_migration():
    """vLLM cannot move a running request between servers: a cluster that says it can would have the
    what-if price moves the servers never make."""
    cluster = cluster_of(["cluster=cpu_small", "cluster.migrate_decodes_on_switch=true"])
    with pytest.raises(ValueError, match="cluster.migrate_decodes_on_switch=true is invalid for the vLLM backend"):
        vllm_switch_wait_s(cluster)


def test_removed_backend_switch_time_is_refused():
    """The schema refuses the removed key with the pointer to the cluster key that owns the value."""
    with pytest.raises(ValueError, match="backend.switch_time_s=2.0 is no longer a key here.*router_update_s"):
        check_group("backend", {**OmegaConf.to_container(load_config(["backend=vllm_cpu"]).backend), "switch_time_s": 2.0})
    for name in ("vllm", "vllm_cpu", "sglang"):
        assert "switch_time_s" not in OmegaConf.to_container(load_config([f"backend={name}"]).backend)


def test_sglang_cluster_checks():
    check_sglang_cluster(cluster_of(["cluster=moe_h200_sglang"]))                          # reshard
    check_sglang_cluster(cluster_of(["cluster=dense_h100", "cluster.engine=sglang", "cluster.switch_mechanism=drain"]))
    with pytest.raises(ValueError, match="cluster.engine='vllm' is invalid for the SGLang backend"):
        check_sglang_cluster(cluster_of(["cluster=moe_h200"]))
    with pytest.raises(ValueError, match="cluster.switch_mechanism='kv_both' is invalid for the SGLang backend"):
        check_sglang_cluster(cluster_of(["cluster=cpu_small", "cluster.engine=sglang"]))
    with pytest.raises(ValueError, match=r"cluster.switch_mechanism='drain' is invalid "
                                         r".* decode=\{tp: 1, dp: 4, ep: true\}"):
        check_sglang_cluster(cluster_of(["cluster=moe_h200_sglang", "cluster.switch_mechanism=drain"]))
    with pytest.raises(ValueError, match="cluster.engine"):                                # before any server starts
        SGLangBackend.from_config(cluster_of(["cluster=moe_h200"]), [Role.PREFILL] * 8, **sglang_cfg())


def test_sglang_reshard_relaunches_only_when_the_parallelism_changes():
    moe = cluster_of(["cluster=moe_h200_sglang"])
    assert sglang_switch_relaunches(moe, Role.PREFILL, Role.DECODE)          # TP4 <-> DP4 attention + EP4
    assert sglang_switch_relaunches(moe, Role.DECODE, Role.PREFILL)
    dense = cluster_of(["cluster=dense_h100", "cluster.engine=sglang"])
    assert not sglang_switch_relaunches(dense, Role.PREFILL, Role.DECODE)    # /pd_role_switch in place


def test_sglang_reshard_switch_relaunches_with_the_new_roles_flags():
    """A reshard switch from TP4 prefill to DP4+EP4 decode restarts the server with decode's flags (no
    /pd_role_switch: PR #28403 has no DP attention); a pool that records restarts, no HTTP."""
    cluster = cluster_of(["cluster=moe_h200_sglang", "cluster.num_engines=2"])
    restarts = []

    class Pool:
        async def restart(self, i, argv):
            restarts.append((i, argv))
            return f"http://127.0.0.1:{9100 + i}"

    def argv_for(i, role):
        return sglang_argv(sglang_cfg(), cluster, role, 8998 + i)
    backend = SGLangBackend(["http://127.0.0.1:1", "http://127.0.0.1:2"], [Role.PREFILL, Role.DECODE],
                            router_url=None, bootstrap_ports=[8998, 8999], pool=Pool(), argv_for=argv_for,
                            relaunch=lambda old, new: sglang_switch_relaunches(cluster, old, new))
    try:
        backend.loop.run_until_complete(backend._apply_switch(backend.engines[0], Role.DECODE))
    finally:
        backend.loop.close()
    assert restarts == [(0, argv_for(0, Role.DECODE))]
    assert value(restarts[0][1], "--dp-size") == "4" and value(restarts[0][1], "--disaggregation-mode") == "decode"
    assert backend.engines[0].role == Role.DECODE and backend.engines[0].url == "http://127.0.0.1:9100"


@pytest.mark.parametrize("drains", [False, True])
def test_http_switch_drains_only_when_the_backend_says_so(drains):
    """An engine with a leg in flight is asked to switch: the vLLM backend (kv_both, drains_on_switch
    False) switches at once and the leg stays in flight; a draining backend (SGLang) waits for it."""
    import asyncio
    from harness.engines.base import HttpBackendBase

    class Backend(HttpBackendBase):
        drains_on_switch = drains

    backend = Backend(["http://127.0.0.1:9"], [Role.PREFILL])
    e = backend.engines[0]
    e.legs.add("a leg in flight")
    e.target_role, e.available = Role.DECODE, False

    async def switch() -> bool:
        try:
            await asyncio.wait_for(backend._switch(e), timeout=0.5)
            return True
        except asyncio.TimeoutError:
            return False
    done = backend.loop.run_until_complete(switch())
    assert done is not drains
    if not drains:
        assert e.role == Role.DECODE and e.available and e.legs == {"a leg in flight"}
    assert VllmBackend.drains_on_switch is False
    backend.loop.close()

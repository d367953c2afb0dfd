"""VllmBackend: the rollout's legs as requests to vLLM OpenAI-compatible servers.

Every server's command line comes from the cluster config (parallelism of the engine's role, token budget,
running-request cap: vllm_cluster_flags) and the backend config (model, dtype, connector: vllm_argv); a
switch waits what the cluster's kv_both mechanism charges (cluster.router_update_s: vllm_switch_wait_s).

Every engine is launched identically with a kv_both connector (ExampleConnector through a shared
directory on CPU, NixlConnector on GPUs), so a role is only a routing decision: a switch is a routing
change, no drain and no restart (vLLM NixlConnector docs): the engine finishes its running legs while
it takes legs of its new role, as the simulator's kv_both does.

Per turn, on the route the policy chose:
- colocated: one streamed /v1/completions request on the engine;
- disaggregated: a prefill leg (`max_tokens: 1`) on the prefill engine, which stores the prompt's KV;
  then the same prompt, streamed, on the decode engine, which loads that KV instead of computing it
  (`kv_transfer_params` of the prefill response are passed on, as vLLM's toy proxy does for NIXL).
Prompts are token ids: a trajectory's prompt is its previous prompt + the ids the server generated
+ fresh random ids for the tool output, so prefix caching sees what a real agent loop produces.
Output lengths are forced with `ignore_eos` + `max_tokens`.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness.api import EventKind as K, Role
from harness.cluster import ClusterConfig, switch_delay_s
from harness.engines.base import EngineGone, HttpBackendBase, Job, LegError, check_extra_args
from harness.engines.server import EnginePool, ServerSpec, new_api_key

NIXL_PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                       "remote_block_ids": None, "remote_host": None, "remote_port": None}
COUNTERS = ("vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_hits_total",
            "vllm:external_prefix_cache_queries_total", "vllm:request_success_total",
            "vllm:generation_tokens_total")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text (prometheus_client's parser) -> {sample name, or name{source=...}: value}, summed
    over the other labels (engines, models); the KV cache size from vllm:cache_config_info's label."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                if "kv_cache_size_tokens" in sample.labels:
                    out["kv_cache_size_tokens"] = float(sample.labels["kv_cache_size_tokens"])
                continue
            source = sample.labels.get("source")
            key = f"{sample.name}{{source={source}}}" if source else sample.name
            out[key] = out.get(key, 0.0) + sample.value
    return out


# --- the servers' command lines ------------------------------------------------------------------
# The cluster config (harness/cluster.py) is the one source of every value the simulator, Prorsa's what-if
# and the real servers share: parallelism per role, token budget, running-request cap, switch mechanism.
# The backend config (configs/backend/vllm*.yaml) holds only what the cluster does not model (model path,
# dtype, KV connector, ports, extra_args). A flag derived from the cluster may not be repeated in
# backend.extra_args: the run stops and names the cluster key to set instead.

def vllm_cluster_flags(cluster: ClusterConfig, role: Role) -> list[str]:
    """The vLLM server flags that come from the cluster config, for an engine launched for `role`.
    Flag names checked against vLLM 0.32's EngineArgs.add_cli_args (vllm/engine/arg_utils.py)."""
    par = cluster.parallelism[role]
    # TP inside one DP rank (each DP rank owns TP GPU workers): "--tensor-parallel-size, -tp"
    # (arg_utils.py ParallelConfig group; docs.vllm.ai/en/latest/serving/data_parallel_deployment/).
    flags = ["--tensor-parallel-size", str(par.tp)]
    if par.dp > 1:
        # attention data-parallel ranks, one core engine each, DP x TP GPUs per server; with a MoE model
        # the ranks step together: "--data-parallel-size, -dp" (data_parallel_deployment docs).
        flags += ["--data-parallel-size", str(par.dp)]
    if par.ep:
        # experts spread over all DP x TP GPUs (EP size = DP x TP) instead of a DP x TP tensor-parallel
        # group: "--enable-expert-parallel, -ep" (docs.vllm.ai/en/latest/serving/expert_parallel_deployment/).
        flags.append("--enable-expert-parallel")
    # Per scheduler, i.e. per DP rank (each DP rank is its own core engine and scheduler), as the simulator
    # applies them per rank: "--max-num-batched-tokens", "--max-num-seqs" (arg_utils.py SchedulerConfig group).
    flags += ["--max-num-batched-tokens", str(cluster.max_num_batched_tokens),
              "--max-num-seqs", str(cluster.max_num_seqs)]
    return flags


def _vllm_owned_flags(role: Role) -> dict[str, str]:
    """Flag (every spelling vLLM accepts) -> the cluster key it comes from."""
    p = f"parallelism.{role.value}"
    return {"--tensor-parallel-size": f"{p}.tp", "-tp": f"{p}.tp",
            "--data-parallel-size": f"{p}.dp", "-dp": f"{p}.dp",
            "--enable-expert-parallel": f"{p}.ep", "--no-enable-expert-parallel": f"{p}.ep", "-ep": f"{p}.ep",
            "--max-num-batched-tokens": "max_num_batched_tokens", "--max-num-seqs": "max_num_seqs"}


def vllm_argv(cfg: dict, cluster: ClusterConfig, role: Role = Role.COLOCATED) -> list[str]:
    """The command line of one vLLM engine launched for `role` ("{port}" stands for its port): the backend
    config's flags, the cluster's (vllm_cluster_flags), then backend.extra_args. Pure: nothing is built,
    started or read. `cfg["model"]` must be a path (vllm_server_specs builds the tiny model when it is null) and,
    with ExampleConnector, `cfg["kv_shared_dir"]` the shared KV directory."""
    extra = [str(a) for a in cfg.get("extra_args") or []]
    check_extra_args(extra, _vllm_owned_flags(role))
    if "--no-enable-chunked-prefill" in extra and cluster.max_num_batched_tokens < int(cfg["max_model_len"]):
        # vLLM refuses to start (SchedulerConfig.verify_max_model_len, vllm/config/scheduler.py)
        raise ValueError(f"cluster.max_num_batched_tokens={cluster.max_num_batched_tokens} is invalid with "
                         f"--no-enable-chunked-prefill in backend.extra_args; allowed: >= backend.max_model_len "
                         f"({cfg['max_model_len']})")
    if cluster.max_num_batched_tokens < cluster.max_num_seqs:
        # vLLM refuses to start (SchedulerConfig.verify_max_model_len, vllm/config/scheduler.py)
        raise ValueError(f"cluster.max_num_batched_tokens={cluster.max_num_batched_tokens} is invalid for vLLM; "
                         f"allowed: >= cluster.max_num_seqs ({cluster.max_num_seqs})")
    return _vllm_base_argv(cfg) + vllm_cluster_flags(cluster, role) + extra


def _vllm_base_argv(cfg: dict) -> list[str]:
    """The flags from the backend config: model, address, port and key (placeholders filled at start,
    harness/engines/server.py), dtype, KV connector (kv_both), metrics."""
    if not cfg.get("model") or cfg["model"] == "???":
        raise ValueError(f"backend.model={cfg.get('model')!r} is invalid; allowed: a model directory or hub name")
    kv = {"kv_connector": cfg.get("kv_connector", "ExampleConnector"), "kv_role": "kv_both",
          "kv_load_failure_policy": cfg.get("kv_load_failure_policy", "recompute")}
    if kv["kv_connector"] == "ExampleConnector":
        if not cfg.get("kv_shared_dir"):
            raise ValueError("backend.kv_shared_dir is required with backend.kv_connector=ExampleConnector")
        kv["kv_connector_extra_config"] = {"shared_storage_path": cfg["kv_shared_dir"]}
    argv = [cfg.get("python") or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(cfg["model"]), "--served-model-name", cfg.get("served_model_name", "model"),
            "--host", "{host}", "--port", "{port}", "--api-key", "{api_key}", "--dtype", str(cfg.get("dtype", "auto")), "--max-model-len", str(cfg["max_model_len"]),
            "--kv-transfer-config", json.dumps(kv), "--enable-per-request-metrics",
            "--enable-prompt-tokens-details", "--disable-uvicorn-access-log"]
    if cfg.get("skip_tokenizer_init", True):
        argv.append("--skip-tokenizer-init")
    return argv


def vllm_switch_wait_s(cluster: ClusterConfig) -> float:
    """How long the real vLLM backend waits in a switch, from the cluster config (what Prorsa and the
    simulator charge). Every engine is launched with kv_role=kv_both, so a switch is a routing change:
    the only mechanism this backend has is kv_both, priced at cluster.router_update_s."""
    if cluster.switch_mechanism != "kv_both":
        raise ValueError(f"cluster.switch_mechanism={cluster.switch_mechanism!r} is invalid for the vLLM backend: "
                         "its engines are launched with kv_role=kv_both, so a role switch is a routing change; "
                         "allowed: kv_both (override cluster.switch_mechanism=kv_both; the switch then costs "
                         "cluster.router_update_s)")
    if cluster.engine != "vllm":
        raise ValueError(f"cluster.engine={cluster.engine!r} is invalid for the vLLM backend (the what-if would "
                         "model another engine's steps); allowed: vllm")
    if cluster.migrate_decodes_on_switch:
        raise ValueError("cluster.migrate_decodes_on_switch=true is invalid for the vLLM backend: vLLM cannot move "
                         "a running request to another server (Llumnix patches it to); allowed: false")
    return float(switch_delay_s(cluster, False))


def vllm_server_specs(cfg: dict, cluster: ClusterConfig, roles: list[Role] | None = None,
                      num_engines: int | None = None) -> tuple[list[ServerSpec], str]:
    """Every engine's launch spec: engine i runs with the parallelism of `roles[i]` (its initial role;
    kv_both switches keep it, as in the simulator), all colocated's when `roles` is None. `num_engines`
    defaults to the cluster's. Builds the tiny model when backend.model is null and makes the KV and log
    directories; draws the servers' API key; returns the specs and the KV directory."""
    n = cluster.num_engines if num_engines is None else num_engines
    roles = list(roles) if roles is not None else [Role.COLOCATED] * n
    if len(roles) != n:
        raise ValueError(f"{len(roles)} roles for {n} engines")
    cfg = _resolved(cfg)
    # NixlConnector's side channel listens on VLLM_NIXL_SIDE_CHANNEL_PORT + the DP rank
    # (vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py): engines are spaced by the DP size.
    stride = max(p.dp for p in cluster.parallelism.values())
    api_key = new_api_key()
    return [_spec(cfg, i, vllm_argv(cfg, cluster, role), _env(cfg, i, stride), cluster.gpus_per_engine, api_key)
            for i, role in enumerate(roles)], cfg["kv_shared_dir"]


def _resolved(cfg: dict) -> dict:
    """The backend config with its model (the tiny model when null), KV and log directories made."""
    cfg = dict(cfg)
    if not cfg.get("model"):
        from harness.engines.model import tiny_qwen3
        cfg["model"] = str(tiny_qwen3(dtype=cfg.get("dtype", "float32")))
    cfg["kv_shared_dir"] = cfg.get("kv_shared_dir") or tempfile.mkdtemp(prefix="prorsa-kv-")
    log_dir = Path(cfg.get("log_dir") or tempfile.mkdtemp(prefix="prorsa-engines-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    cfg["log_dir"] = str(log_dir)
    return cfg


def _env(cfg: dict, i: int, nixl_stride: int) -> dict[str, str]:
    env = {k: str(v) for k, v in (cfg.get("env") or {}).items()}
    if cfg.get("cpu_binding"):
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(i % (os.cpu_count() or 1))
    if cfg.get("kv_connector") == "NixlConnector":
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(int(cfg.get("nixl_base_port", 5600)) + i * nixl_stride)
    return env


def _spec(cfg: dict, i: int, argv: list[str], env: dict, gpus_per_engine: int, api_key: str) -> ServerSpec:
    return ServerSpec(engine_id=i, argv=argv, env=env, api_key=api_key,
                      port=int(cfg.get("base_port") or 0) and int(cfg["base_port"]) + i,
                      log_path=str(Path(cfg["log_dir"]) / f"engine{i}.log"),
                      startup_timeout_s=float(cfg.get("startup_timeout_s", 600)),
                      num_cpus=float(cfg.get("cpus_per_engine", 1)),
                      num_gpus=float(gpus_per_engine if cfg.get("gpus", False) else 0))


class VllmBackend(HttpBackendBase):
    name = "vllm"
    drains_on_switch = False   # kv_both, the only mechanism it has (vllm_switch_wait_s)

    def __init__(self, pool: EnginePool, roles: list[Role], *, served_model_name: str = "model",
                 kv_connector: str = "ExampleConnector", owns_pool: bool = False, kv_shared_dir: str | None = None,
                 seed: int = 0, vocab: int = 4096, **kw):
        if not pool.urls:
            pool.start()
        super().__init__(list(pool.urls), roles, api_key=pool.api_key, **kw)
        self.pool = pool
        self.owns_pool = owns_pool
        self.kv_shared_dir = kv_shared_dir
        self.model = served_model_name
        self.nixl = kv_connector == "NixlConnector"
        self.vocab = vocab
        self._rng = random.Random(f"{seed}-{os.urandom(8).hex()}")   # fresh ids per run: no stale KV hits
        self._context: dict[int, list[int]] = {}       # trajectory -> prompt + output ids of its last turn
        self.metrics_start: list[dict] = []
        self.metrics_end: list[dict] = []

    @classmethod
    def from_config(cls, cluster: ClusterConfig, roles: list[Role], seed: int = 0, **cfg) -> "VllmBackend":
        """The `_target_` of configs/backend/vllm*.yaml: `cfg` is the backend group's keys."""
        kw = backend_kwargs(cfg, cluster)           # checks the cluster before anything starts
        specs, kv_dir = vllm_server_specs(cfg, cluster, roles)
        ray_cfg = cfg.get("ray") or {}
        pool = EnginePool(specs, use_ray=bool(ray_cfg.get("enabled", True)), ray_address=ray_cfg.get("address"))
        try:
            pool.start()
        except BaseException:
            pool.stop()
            raise
        return cls(pool, roles, owns_pool=True, kv_shared_dir=kv_dir, seed=seed, **kw)

    # --- prompts --------------------------------------------------------------------------------
    def _prompt(self, job: Job) -> list[int]:
        r = job.request
        ids = list(self._context.get(r.trajectory_id, [])) if r.turn else []
        if len(ids) > r.prompt_tokens:
            raise LegError(f"trajectory {r.trajectory_id} turn {r.turn}: context {len(ids)} ids > prompt "
                           f"{r.prompt_tokens} tokens")
        ids += [self._rng.randrange(3, self.vocab) for _ in range(r.prompt_tokens - len(ids))]
        return ids

    def _body(self, ids: list[int], max_tokens: int, stream: bool) -> dict:
        body = {"model": self.model, "prompt": ids, "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0.0, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
            body["return_token_ids"] = True
        return body

    # --- legs -------------------------------------------------------------------------------------
    async def _serve_turn(self, job: Job) -> None:
        r, route = job.request, job.route
        t_ready = self.now()
        ids = self._prompt(job)
        if not route.disaggregated:
            out = await self._stream_leg(job, "colocated", route.prefill_engine, ids, t_ready, None)
        else:
            kv_params = await self._prefill_leg(job, ids, t_ready)
            out = await self._stream_leg(job, "decode", route.decode_engine, ids, self.now(), kv_params)
        self._context[r.trajectory_id] = ids + out
        leg = job.legs[-1]
        self._event(K.DECODE_END, job, leg.engine_id, t=leg.t_done, tokens=len(out))

    async def _prefill_leg(self, job: Job, ids: list[int], t_ready: float) -> dict | None:
        eid = job.route.prefill_engine
        leg = self._open_leg(job, "prefill", eid, t_ready)
        body = self._body(ids, 1, stream=False)
        if self.nixl:
            body["kv_transfer_params"] = dict(NIXL_PREFILL_PARAMS)
        url = self.engines[eid].url + "/v1/completions"
        try:
            async with self.session.post(url, json=body) as resp:
                data = await self._read_json(resp, eid)
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # noqa: BLE001 - connection-level: the engine is gone or going
            raise await self._classify(eid, exc) from exc
        t_done = self.now()
        h0 = self.now()
        leg.t_done = leg.t_first = t_done
        self._take_usage(leg, data)
        leg.generated = 1
        self._event(K.PREFILL_START, job, eid, t=self._sched_time(leg), tokens=max(leg.cached_tokens, 0))
        self._event(K.PREFILL_END, job, eid, t=t_done, tokens=leg.prompt_tokens - max(leg.cached_tokens, 0))
        leg.handler_s = self.now() - h0
        self._close_leg(job, leg, "ok")
        return data.get("kv_transfer_params")

    async def _stream_leg(self, job: Job, kind: str, eid: int, ids: list[int], t_ready: float,
                          kv_params: dict | None) -> list[int]:
        leg = self._open_leg(job, kind, eid, t_ready)
        body = self._body(ids, job.request.output_tokens, stream=True)
        if kv_params:
            body["kv_transfer_params"] = kv_params
        url = self.engines[eid].url + "/v1/completions"
        out: list[int] = []
        usage = None
        handler = 0.0
        try:
            async with self.session.post(url, json=body) as resp:
                if resp.status != 200:
                    await self._read_json(resp, eid)
                async for raw in resp.content:
                    h0 = self.now()
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        handler += self.now() - h0
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        break
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        raise LegError(f"engine {eid}: {chunk['error']}")
                    for c in chunk.get("choices") or ():
                        toks = c.get("token_ids") or ()
                        if toks and math.isnan(leg.t_first):
                            leg.t_first = h0
                            self._event(K.DECODE_START, job, eid, t=h0)
                            self._event(K.FIRST_TOKEN, job, eid, t=h0)
                        out.extend(toks)
                        leg.generated = len(out)
                    if chunk.get("usage"):
                        usage = chunk
                    handler += self.now() - h0
        except (asyncio.CancelledError, LegError, EngineGone):
            raise
        except Exception as exc:   # noqa: BLE001
            raise await self._classify(eid, exc) from exc
        h0 = self.now()
        leg.t_done = h0
        if len(out) != job.request.output_tokens:
            raise LegError(f"engine {eid}: {len(out)} output tokens, expected {job.request.output_tokens}")
        if usage is not None:
            self._take_usage(leg, usage)
        cached = max(leg.cached_tokens, 0)
        if kind == "colocated":
            self._event(K.PREFILL_START, job, eid, t=self._sched_time(leg), tokens=cached)
            self._event(K.PREFILL_END, job, eid, t=leg.t_first, tokens=leg.prompt_tokens - cached)
        else:
            self._event(K.TRANSFER_END, job, eid, t=leg.t_first, tokens=cached)
        leg.handler_s = handler + self.now() - h0
        self._close_leg(job, leg, "ok")
        return out

    def _sched_time(self, leg) -> float:
        """When the server scheduled the leg, on our clock: first token - server TTFT (else submit)."""
        ttft = leg.server.get("time_to_first_token_ms")
        if ttft is None:
            return leg.t_submit
        return min(max(leg.t_submit, leg.t_first - ttft / 1000.0), leg.t_first)

    @staticmethod
    def _take_usage(leg, data: dict) -> None:
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            leg.cached_tokens = int(details["cached_tokens"])
        leg.server = {k: v for k, v in (data.get("metrics") or {}).items() if not isinstance(v, dict)}

    async def _read_json(self, resp, eid: int) -> dict:
        if resp.status == 200:
            return await resp.json(content_type=None)
        text = (await resp.text())[:500]
        if resp.status >= 500 and not await self._healthy(eid):
            raise EngineGone(eid, f"HTTP {resp.status} and /health failing: {text}")
        raise LegError(f"engine {eid}: HTTP {resp.status}: {text}")

    async def _classify(self, eid: int, exc: BaseException) -> Exception:
        import aiohttp
        if isinstance(exc, (aiohttp.ClientConnectionError, ConnectionError, asyncio.TimeoutError)):
            return EngineGone(eid, f"{type(exc).__name__}: {exc}")
        if isinstance(exc, aiohttp.ClientPayloadError) or not await self._healthy(eid):
            return EngineGone(eid, f"{type(exc).__name__}: {exc}")
        return LegError(f"engine {eid}: {type(exc).__name__}: {exc}")

    # --- servers --------------------------------------------------------------------------------
    async def _restart_server(self, engine_id: int) -> str:
        return await self.pool.restart(engine_id)

    async def _kill_server(self, engine_id: int) -> None:
        await self.pool.kill(engine_id)

    async def _hang_server(self, engine_id: int) -> None:
        await self.pool.hang(engine_id)

    async def _scrape(self) -> list[dict]:
        async def one(e):
            try:
                async with self.session.get(e.url + "/metrics") as r:
                    return parse_metrics(await r.text())
            except Exception:   # noqa: BLE001
                return {}
        return list(await asyncio.gather(*[one(e) for e in self.engines]))

    async def _on_start(self) -> None:
        self.metrics_start = await self._scrape()
        for e, m in zip(self.engines, self.metrics_start):
            if m.get("kv_cache_size_tokens"):
                e.kv_capacity_tokens = int(m["kv_cache_size_tokens"])

    async def _on_finish(self) -> None:
        self.metrics_end = await self._scrape()

    def server_counters(self) -> list[dict]:
        """Per engine: the change of the servers' Prometheus counters over the run (a restart resets
        the counters: then the value after the restart)."""
        out = []
        for e, a, b in zip(self.engines, self.metrics_start, self.metrics_end):
            row = {"engine_id": e.engine_id, "restarts": e.restarts}
            for k, v in b.items():
                if k.startswith("vllm:") and k.endswith("_total") or "_total{" in k:
                    row[k] = v if e.restarts else v - a.get(k, 0.0)
            out.append(row)
        return out

    def run(self) -> None:
        try:
            super().run()
        finally:
            if self.owns_pool:
                self.close()

    def close(self) -> None:
        """Stop the servers this backend started and remove the shared KV directory."""
        self.pool.stop()
        if self.kv_shared_dir:
            shutil.rmtree(self.kv_shared_dir, ignore_errors=True)


def backend_kwargs(cfg: dict, cluster: ClusterConfig) -> dict:
    """The VllmBackend keyword arguments a backend config sets; the switch wait comes from the cluster
    config (vllm_switch_wait_s), which must describe vLLM engines switching as kv_both."""
    return {"served_model_name": cfg.get("served_model_name", "model"),
            "kv_connector": cfg.get("kv_connector", "ExampleConnector"),
            "time_scale": float(cfg.get("time_scale", 1.0)), "switch_wait_s": vllm_switch_wait_s(cluster),
            "max_retries": int(cfg.get("max_retries", 3)),
            "health_interval_s": float(cfg.get("health_interval_s", 2.0)),
            "vocab": int(cfg.get("vocab", 4096))}

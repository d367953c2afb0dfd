"""SGLangBackend: the rollout's legs on SGLang servers in PD mode, with run-time role switching.

NOT RUN on real SGLang here: SGLang needs CUDA (PyPI) or a source build on AMX Xeons; the development
machines have neither. Its test (tests/test_sglang_stub.py) runs it against a STUB HTTP server that
records the calls. Protocol from SGLang's PD disaggregation docs and router (sglang_router):

- Servers: `python -m sglang.launch_server --disaggregation-mode prefill|decode
  --disaggregation-transfer-backend <b> --disaggregation-bootstrap-port <p> [--enable-pd-role-switch]`
  plus the flags the cluster config gives the engine's role (sglang_cluster_flags: TP, DP attention, EP,
  chunk size, request cap, mixed chunk, CUDA-graph batch). Colocated engines are launched with
  `--disaggregation-mode null` and cannot switch (PR #28403 switches only between prefill and decode,
  plain TP only, so --enable-pd-role-switch only goes to plain-TP prefill and decode engines).
- Legs: the policy picks both engines, so a turn is sent as mini_lb does: the same /generate request
  (input_ids, max_new_tokens, ignore_eos) to the prefill and the decode engine at once, with
  bootstrap_host/bootstrap_port of the prefill engine and a random 63-bit bootstrap_room.
- Router (sglang_router, `--pd-disaggregation`): membership follows the roles (POST /workers
  {url, worker_type, bootstrap_port}, DELETE /workers/{id}), for clients that go through it.
- Role switch (cluster.switch_mechanism, drain or reshard; check_sglang_cluster): DELETE the worker from
  the router -> drain (no new legs; in-flight ones finish) -> POST /pd_role_switch {"new_role"} -> POST
  /workers with the new type. Under reshard, a switch between roles of different parallelism (or without
  in-place switching) relaunches the server with the new role's flags instead. A failed switch marks the
  instance unhealthy: it is restarted with the new role (when this backend launched it). No extra wait:
  the time the switch takes is the servers' own (the cluster's switch times are Prorsa's prediction of it).
"""
from __future__ import annotations

import asyncio
import random
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from harness.api import EventKind as K, Role
from harness.cluster import ClusterConfig
from harness.engines.base import EngineGone, EngineRuntime, HttpBackendBase, Job, LegError, check_extra_args
from harness.engines.server import EnginePool, ServerSpec, new_api_key


# --- the servers' command lines ------------------------------------------------------------------
# As for vLLM (harness/engines/vllm.py): the cluster config is the one source of parallelism, token
# budgets, batch limits and the switch mechanism; the backend config holds the rest. Flag names from SGLang's
# ServerArgs.add_cli_args (sgl-project/sglang python/sglang/srt/server_args.py) and its server-arguments page
# (docs.sglang.io/advanced_features/server_arguments.html).

def sglang_cluster_flags(cluster: ClusterConfig, role: Role) -> list[str]:
    """The SGLang server flags that come from the cluster config, for an engine launched for `role`."""
    par = cluster.parallelism[role]
    gpus = par.tp * par.dp
    # SGLang's --tp-size counts every GPU of the server; with DP attention each of the --dp-size attention
    # ranks gets tp_size / dp_size of them ("--tp 8 --dp 8 --enable-dp-attention" is eight TP1 attention ranks:
    # docs.sglang.io/advanced_features/dp_dpa_smg_guide.html; server_args.py _handle_data_parallelism asserts
    # tp_size % dp_size == 0).
    flags = ["--tp-size", str(gpus)]
    if par.dp > 1:
        # cluster dp = attention data-parallel ranks of one engine: DP attention, not DP replicas.
        flags += ["--dp-size", str(par.dp), "--enable-dp-attention"]
    if par.ep:
        # experts over all the engine's GPUs: "--expert-parallel-size, --ep-size" (server_args.py;
        # docs.sglang.io/cookbook/base/reference/server_arguments).
        flags += ["--ep-size", str(gpus)]
    # The cluster's chunk size and request cap are per attention rank (as the simulator applies them); SGLang's
    # flags are per server and divided among DP-attention ranks: chunked_prefill_size // dp_size
    # (server_args.py _handle_data_parallelism), max_running_requests // dp_size per worker (SGLang PR #20063).
    flags += ["--chunked-prefill-size", str(cluster.chunked_prefill_size * par.dp),
              "--max-running-requests", str(cluster.max_num_seqs * par.dp)]
    if cluster.enable_mixed_chunk:
        # decodes ride along a prefill batch: "--enable-mixed-chunk" (store_true; server_args.py)
        flags.append("--enable-mixed-chunk")
    if cluster.cuda_graph_max_bs > 0:
        # largest decode batch per rank run as a CUDA graph: "--cuda-graph-max-bs" (server_args.py). 0 in the
        # cluster (the simulator: no limit) leaves SGLang's own default, which depends on the GPU's memory.
        flags += ["--cuda-graph-max-bs", str(cluster.cuda_graph_max_bs)]
    return flags


def sglang_switches_in_place(cluster: ClusterConfig, role: Role) -> bool:
    """Whether an engine launched for `role` gets --enable-pd-role-switch: prefill and decode engines with
    plain TP (PR #28403 switches only between prefill and decode, without DP attention or EP)."""
    par = cluster.parallelism[role]
    return role != Role.COLOCATED and par.dp == 1 and not par.ep


def sglang_switch_relaunches(cluster: ClusterConfig, old: Role, new: Role) -> bool:
    """Whether a switch old -> new relaunches the server with the new role's flags (cluster.switch_mechanism
    reshard with another parallelism, or a role SGLang cannot switch in place) instead of POST /pd_role_switch."""
    return (cluster.parallelism[old] != cluster.parallelism[new]
            or not (sglang_switches_in_place(cluster, old) and sglang_switches_in_place(cluster, new)))


def check_sglang_cluster(cluster: ClusterConfig) -> None:
    """The cluster config must describe what the SGLang backend does, so that the simulator and Prorsa's
    what-if price what the servers run: SGLang's step semantics and a switch SGLang has."""
    if cluster.engine != "sglang":
        raise ValueError(f"cluster.engine={cluster.engine!r} is invalid for the SGLang backend (the what-if would "
                         "model vLLM's decode-first steps); allowed: sglang")
    if cluster.switch_mechanism not in ("drain", "reshard"):
        raise ValueError(f"cluster.switch_mechanism={cluster.switch_mechanism!r} is invalid for the SGLang backend "
                         "(its PD servers are launched as prefill or decode, there is no kv_both); allowed: "
                         "drain (POST /pd_role_switch, PR #28403), reshard (relaunch when the parallelism changes)")
    if cluster.switch_mechanism == "drain":
        p, d = cluster.parallelism[Role.PREFILL], cluster.parallelism[Role.DECODE]
        if p != d or not sglang_switches_in_place(cluster, Role.PREFILL):
            raise ValueError(f"cluster.switch_mechanism='drain' is invalid for the SGLang backend with "
                             f"cluster.parallelism.prefill={_par(p)} and decode={_par(d)}: /pd_role_switch keeps "
                             "the parallelism and needs plain TP (no DP attention, no EP; PR #28403); allowed: "
                             "reshard, or the same {tp, dp: 1, ep: false} for prefill and decode")


def _par(p) -> str:
    return f"{{tp: {p.tp}, dp: {p.dp}, ep: {str(p.ep).lower()}}}"


def _sglang_owned_flags(role: Role) -> dict[str, str]:
    """Flag (every spelling SGLang accepts) -> the cluster key it comes from."""
    p = f"parallelism.{role.value}"
    return {"--tp-size": f"{p}.tp", "--tensor-parallel-size": f"{p}.tp", "--tp": f"{p}.tp",
            "--dp-size": f"{p}.dp", "--data-parallel-size": f"{p}.dp", "--dp": f"{p}.dp",
            "--enable-dp-attention": f"{p}.dp",
            "--ep-size": f"{p}.ep", "--expert-parallel-size": f"{p}.ep", "--ep": f"{p}.ep",
            "--chunked-prefill-size": "chunked_prefill_size", "--max-running-requests": "max_num_seqs",
            "--enable-mixed-chunk": "enable_mixed_chunk", "--cuda-graph-max-bs": "cuda_graph_max_bs",
            "--enable-pd-role-switch": "switch_mechanism"}


def sglang_argv(cfg: dict, cluster: ClusterConfig, role: Role, bootstrap_port: int) -> list[str]:
    """The command line of one SGLang engine launched for `role` ("{host}", "{port}" and "{api_key}" are
    filled at start, harness/engines/server.py): the backend
    config's flags, the cluster's (sglang_cluster_flags), the PD flags, then backend.extra_args. Pure."""
    if not cfg.get("model") or cfg.get("model") == "???":
        raise ValueError(f"backend.model={cfg.get('model')!r} is invalid; allowed: a model path for --model-path")
    extra = [str(a) for a in cfg.get("extra_args") or []]
    check_extra_args(extra, _sglang_owned_flags(role))
    mode = "null" if role == Role.COLOCATED else role.value
    argv = [cfg.get("python") or sys.executable, "-m", "sglang.launch_server", "--model-path", str(cfg["model"]),
            "--host", "{host}", "--port", "{port}", "--api-key", "{api_key}", "--disaggregation-mode", mode,
            "--enable-metrics"]
    argv += sglang_cluster_flags(cluster, role)
    if role != Role.COLOCATED:
        argv += ["--disaggregation-transfer-backend", cfg.get("transfer_backend", "mooncake"),
                 "--disaggregation-bootstrap-port", str(bootstrap_port)]
        if sglang_switches_in_place(cluster, role):
            argv.append("--enable-pd-role-switch")
    return argv + extra


class SGLangBackend(HttpBackendBase):
    name = "sglang"

    def __init__(self, urls: list[str], roles: list[Role], *, router_url: str | None, bootstrap_ports: list[int],
                 pool: EnginePool | None = None, argv_for=None, relaunch=None, vocab: int = 4096, seed: int = 0,
                 **kw):
        super().__init__(urls, roles, **kw)
        self.router_url = router_url.rstrip("/") if router_url else None
        self.bootstrap_ports = bootstrap_ports
        self.pool = pool
        self._argv_for = argv_for          # (engine_id, role) -> argv, to relaunch with another role
        self._relaunch = relaunch          # (old, new) -> True: the switch relaunches (reshard), no /pd_role_switch
        self.vocab = vocab
        self._rng = random.Random(seed)
        self._context: dict[int, list[int]] = {}
        self.worker_ids: dict[int, str] = {}

    @classmethod
    def from_config(cls, cluster: ClusterConfig, roles: list[Role], seed: int = 0, **cfg) -> "SGLangBackend":
        """The `_target_` of configs/backend/sglang.yaml: `cfg` is the backend group's keys (`seed` is
        taken like every backend's; the servers draw nothing)."""
        check_sglang_cluster(cluster)
        n = cluster.num_engines
        base_bp = int(cfg.get("bootstrap_base_port", 8998))
        bps = [base_bp + i for i in range(n)]
        # No extra wait in a switch: the server's own drain and /pd_role_switch (or relaunch) take the time
        # that cluster.switch_time_s / reshard_switch_time_s predict for Prorsa and the simulator.
        kw = dict(time_scale=float(cfg.get("time_scale", 1.0)), max_retries=int(cfg.get("max_retries", 3)),
                  health_interval_s=float(cfg.get("health_interval_s", 5.0)), vocab=int(cfg.get("vocab", 4096)))
        if cfg.get("urls"):                       # servers started elsewhere (or the test STUB)
            if len(cfg["urls"]) != n:
                raise ValueError(f"backend.urls has {len(cfg['urls'])} entries; cluster.num_engines={n}")
            return cls(list(cfg["urls"]), roles, router_url=cfg.get("router_url"),
                       bootstrap_ports=list(cfg.get("bootstrap_ports") or bps), **kw)

        def argv_for(i: int, role: Role) -> list[str]:
            return sglang_argv(cfg, cluster, role, bps[i])
        log_dir = Path(cfg.get("log_dir") or tempfile.mkdtemp(prefix="prorsa-engines-"))   # never a shared fixed path
        log_dir.mkdir(parents=True, exist_ok=True)
        api_key = new_api_key()
        specs = [ServerSpec(engine_id=i, argv=argv_for(i, roles[i]), port=int(cfg.get("base_port", 30000)) + i,
                            log_path=str(log_dir / f"sglang_engine{i}.log"), api_key=api_key,
                            startup_timeout_s=float(cfg.get("startup_timeout_s", 1200)),
                            num_gpus=float(cluster.gpus_per_engine)) for i in range(n)]
        ray_cfg = cfg.get("ray") or {}
        pool = EnginePool(specs, use_ray=bool(ray_cfg.get("enabled", True)), ray_address=ray_cfg.get("address"))
        pool.start()
        return cls(pool.urls, roles, router_url=cfg.get("router_url"), bootstrap_ports=bps, pool=pool, api_key=api_key,
                   argv_for=argv_for, relaunch=lambda old, new: sglang_switch_relaunches(cluster, old, new), **kw)

    # --- router membership ----------------------------------------------------------------------
    async def _router(self, method: str, path: str, body: dict | None = None) -> dict:
        if not self.router_url:
            return {}
        async with self.session.request(method, self.router_url + path, json=body) as r:
            text = await r.text()
            if r.status >= 300:
                raise RuntimeError(f"router {method} {path}: HTTP {r.status}: {text[:300]}")
            try:
                return await r.json(content_type=None)
            except ValueError:
                return {}

    async def _register(self, e: EngineRuntime) -> None:
        body = {"url": e.url, "worker_type": "regular" if e.role == Role.COLOCATED else e.role.value}
        if e.role == Role.PREFILL:
            body["bootstrap_port"] = self.bootstrap_ports[e.engine_id]
        data = await self._router("POST", "/workers", body)
        self.worker_ids[e.engine_id] = str(data.get("worker_id") or data.get("id") or e.url)

    async def _deregister(self, e: EngineRuntime) -> None:
        wid = self.worker_ids.pop(e.engine_id, None)
        if wid is not None:
            from urllib.parse import quote
            await self._router("DELETE", f"/workers/{quote(wid, safe='')}")

    async def _on_start(self) -> None:
        if self.router_url and not self.worker_ids:
            for e in self.engines:
                await self._register(e)

    # --- switches ---------------------------------------------------------------------------------
    def _check_switch(self, e: EngineRuntime, role: Role) -> None:
        if Role.COLOCATED in (e.role, role):
            raise ValueError(f"engine {e.engine_id}: SGLang switches roles only between prefill and decode "
                             f"(PR #28403); asked {e.role.value}->{role.value}")

    async def _on_drain_start(self, e: EngineRuntime, role: Role) -> None:
        await self._deregister(e)

    async def _apply_switch(self, e: EngineRuntime, role: Role) -> None:
        if self._relaunch is not None and self._relaunch(e.role, role):
            # reshard: the new role runs another parallelism (or cannot switch in place): relaunch, unless a
            # restart after a failure already launched it for the new role
            if self.launched[e.engine_id] != role:
                e.url = await self._relaunch_as(e.engine_id, role)
            e.role = role
            await self._register(e)
            return
        ok = False
        try:
            async with self.session.post(e.url + "/pd_role_switch", json={"new_role": role.value}) as r:
                ok = r.status == 200
                detail = (await r.text())[:300]
        except Exception as exc:   # noqa: BLE001
            detail = repr(exc)
        if not ok:   # a failed switch leaves the instance unhealthy: relaunch it with the new role
            if self.pool is None:
                raise RuntimeError(f"engine {e.engine_id}: /pd_role_switch failed ({detail}) and the server "
                                   "was not launched by this backend, so it cannot be restarted")
            e.url = await self._relaunch_as(e.engine_id, role)
        e.role = role
        await self._register(e)

    async def _restart_server(self, engine_id: int) -> str:
        if self.pool is None:
            raise RuntimeError(f"engine {engine_id} failed and was not launched by this backend")
        e = self.engines[engine_id]
        await self._deregister(e)
        url = await self._relaunch_as(engine_id, e.target_role or e.role)
        e.url = url
        await self._register(e)
        return url

    async def _relaunch_as(self, engine_id: int, role: Role) -> str:
        """Restart the server with the flags of `role` (its parallelism and disaggregation mode)."""
        url = await self.pool.restart(engine_id, self._argv_for(engine_id, role))
        self.launched[engine_id] = role
        return url

    async def _kill_server(self, engine_id: int) -> None:
        if self.pool is not None:
            await self.pool.kill(engine_id)

    async def _hang_server(self, engine_id: int) -> None:
        if self.pool is not None:
            await self.pool.hang(engine_id)

    # --- legs -------------------------------------------------------------------------------------
    async def _serve_turn(self, job: Job) -> None:
        r, route = job.request, job.route
        t_ready = self.now()
        ids = list(self._context.get(r.trajectory_id, [])) if r.turn else []
        ids += [self._rng.randrange(3, self.vocab) for _ in range(r.prompt_tokens - len(ids))]
        body = {"input_ids": ids, "stream": False,
                "sampling_params": {"max_new_tokens": r.output_tokens, "ignore_eos": True, "temperature": 0.0}}
        if not route.disaggregated:
            leg = self._open_leg(job, "colocated", route.prefill_engine, t_ready)
            data = await self._post(route.prefill_engine, body)
            leg.t_done = leg.t_first = self.now()
            self._account(job, leg, data, colocated=True)
            out = data.get("output_ids") or []
        else:
            p, d = self.engines[route.prefill_engine], self.engines[route.decode_engine]
            body = {**body, "bootstrap_host": urlparse(p.url).hostname,
                    "bootstrap_port": self.bootstrap_ports[p.engine_id], "bootstrap_room": self._rng.getrandbits(63)}
            pleg = self._open_leg(job, "prefill", p.engine_id, t_ready)
            dleg = self._open_leg(job, "decode", d.engine_id, t_ready)

            async def prefill():
                data = await self._post(p.engine_id, body)
                pleg.t_done = pleg.t_first = self.now()
                self._account(job, pleg, data, colocated=False)
            pdone = asyncio.ensure_future(prefill())
            try:
                ddata = await self._post(d.engine_id, body)
                await pdone
            finally:
                if not pdone.done():
                    pdone.cancel()
            dleg.t_done = dleg.t_first = self.now()
            meta = ddata.get("meta_info") or {}
            dleg.cached_tokens = int(meta.get("cached_tokens", 0))
            dleg.server = {k: v for k, v in meta.items() if isinstance(v, (int, float))}
            self._event(K.TRANSFER_END, job, d.engine_id, t=pleg.t_done, tokens=r.prompt_tokens)
            self._event(K.DECODE_START, job, d.engine_id, t=pleg.t_done)
            self._event(K.FIRST_TOKEN, job, d.engine_id, t=pleg.t_done)
            out = ddata.get("output_ids") or []
            dleg.generated = len(out)
            self._close_leg(job, dleg, "ok")
            leg = dleg
        if len(out) != r.output_tokens:
            raise LegError(f"engine {leg.engine_id}: {len(out)} output ids, expected {r.output_tokens}")
        self._context[r.trajectory_id] = ids + list(out)
        self._event(K.DECODE_END, job, leg.engine_id, t=leg.t_done, tokens=len(out))

    def _account(self, job: Job, leg, data: dict, colocated: bool) -> None:
        meta = data.get("meta_info") or {}
        leg.cached_tokens = int(meta.get("cached_tokens", 0))
        leg.server = {k: v for k, v in meta.items() if isinstance(v, (int, float))}
        self._event(K.PREFILL_START, job, leg.engine_id, t=leg.t_submit, tokens=leg.cached_tokens)
        self._event(K.PREFILL_END, job, leg.engine_id, tokens=leg.prompt_tokens - leg.cached_tokens)
        if colocated:
            out = data.get("output_ids") or []
            leg.generated = len(out)
            self._event(K.DECODE_START, job, leg.engine_id)   # non-streamed: known only at the end
            self._event(K.FIRST_TOKEN, job, leg.engine_id)
        self._close_leg(job, leg, "ok")

    async def _post(self, eid: int, body: dict) -> dict:
        import aiohttp
        try:
            async with self.session.post(self.engines[eid].url + "/generate", json=body) as resp:
                if resp.status == 200:
                    return await resp.json(content_type=None)
                text = (await resp.text())[:300]
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientConnectionError, ConnectionError) as exc:
            raise EngineGone(eid, f"{type(exc).__name__}: {exc}") from exc
        if not await self._healthy(eid):
            raise EngineGone(eid, f"HTTP {resp.status} and /health failing: {text}")
        raise LegError(f"engine {eid}: HTTP {resp.status}: {text}")

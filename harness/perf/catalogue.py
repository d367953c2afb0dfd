"""GPU and model specifications, read from configs/catalogue/ (each entry cites its source there)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

CATALOGUE_DIR = Path(__file__).resolve().parents[2] / "configs" / "catalogue"
BYTES_PER_PARAM = 2   # BF16 weights and KV cache
# Weight (and GEMM input) dtypes the roofline honours: bytes per parameter. `cluster.weight_dtype`
# picks one (bf16 by default); fp8 runs GEMMs at the GPU's `fp8_peak_flops` (configs/catalogue/gpus.yaml)
# and keeps the embedding, the LM head, attention's core and the KV cache in BF16 (DeepSeek-V3 technical
# report, arXiv 2412.19437, section 3.3.1: embedding, output head, gating, norms and attention operators
# stay in BF16/FP32).
WEIGHT_BYTES = {"bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class GPUSpec:
    name: str
    peak_flops: float
    hbm_bytes: float
    hbm_bw: float
    scaleup_bw: float
    nic_bw: float
    fp8_peak_flops: float = 0.0   # dense FP8 FLOP/s; 0: the GPU has no FP8 tensor cores (A100)


@dataclass(frozen=True)
class MoESpec:
    layers: int
    experts: int
    top_k: int
    intermediate: int


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention's shapes (config.json: kv_lora_rank, qk_rope_head_dim,
    qk_nope_head_dim, v_head_dim)."""
    kv_lora_rank: int
    rope_dim: int
    nope_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    total_params: float
    intermediate: int = 0
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    attn_head_dim: int | None = None
    weight_dtype: str = "bf16"   # a key of WEIGHT_BYTES; set from cluster.weight_dtype (harness/cluster.py)

    @property
    def weight_bytes(self) -> int:
        """Bytes per GEMM weight parameter."""
        return WEIGHT_BYTES[self.weight_dtype]

    @property
    def head_params(self) -> float:
        """The embedding table's size; the LM head (untied in every model here) is the same size."""
        return float(self.vocab * self.hidden)

    @property
    def kv_bytes_per_token(self) -> int:
        """Whole-model KV bytes per token: GQA 2*L*kv_heads*d*2, MLA L*(rank+rope)*2."""
        if self.mla is not None:
            return self.layers * (self.mla.kv_lora_rank + self.mla.rope_dim) * BYTES_PER_PARAM
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES_PER_PARAM

    @property
    def prefill_attn_head_dim(self) -> float:
        """The head dim of attention FLOPs in prefill. MLA prefills un-absorbed, as multi-head attention
        over up-projected K/V: q.k over nope + rope dims, p.v over v_head_dim (vLLM
        vllm/v1/attention/backends/mla/common.py, "Compute Friendly Approach"), where decode runs
        absorbed over the latent (attn_head_dim). Other models: the same dim in both phases."""
        if self.mla is not None:
            return (self.mla.nope_dim + self.mla.rope_dim + self.mla.v_head_dim) / 2
        return float(self.attn_head_dim or self.head_dim)

    @property
    def mla_up_proj_params(self) -> float:
        """MLA's K/V up-projection (kv_b_proj: kv_lora_rank -> heads * (nope + v)), all layers. Un-absorbed
        prefill runs it over every cached prefix token again (vLLM's chunked-context loop, same file);
        over new tokens it is part of the dense GEMMs."""
        if self.mla is None:
            return 0.0
        return float(self.layers * self.mla.kv_lora_rank * self.heads * (self.mla.nope_dim + self.mla.v_head_dim))

    @property
    def expert_params(self) -> float:
        if self.moe is None:
            return 0.0
        return float(self.moe.layers * self.moe.experts * 3 * self.hidden * self.moe.intermediate)

    @property
    def active_expert_params(self) -> float:
        if self.moe is None:
            return 0.0
        return float(self.moe.layers * self.moe.top_k * 3 * self.hidden * self.moe.intermediate)

    @property
    def dense_params(self) -> float:
        """Parameters every token passes through (attention, dense MLPs, norms, embeddings)."""
        return self.total_params - self.expert_params

    @property
    def dense_gemm_params(self) -> float:
        """Dense parameters used as GEMMs (the input embedding is a lookup, not a GEMM)."""
        return self.dense_params - self.vocab * self.hidden

    @property
    def active_params(self) -> float:
        return self.dense_params + self.active_expert_params


def _read(name: str) -> dict:
    with open(CATALOGUE_DIR / name) as f:
        return yaml.safe_load(f)


@cache
def gpu_catalogue() -> dict[str, GPUSpec]:
    return {k: GPUSpec(name=k, **{f: float(x) for f, x in v.items()}) for k, v in _read("gpus.yaml").items()}


@cache
def model_catalogue() -> dict[str, ModelSpec]:
    out = {}
    for k, v in _read("models.yaml").items():
        v = dict(v)
        moe = MoESpec(**v.pop("moe")) if "moe" in v else None
        mla = MLASpec(**v.pop("mla")) if "mla" in v else None
        v["total_params"] = float(v["total_params"])  # YAML 1.1 reads "8.2e9" as a string
        out[k] = ModelSpec(name=k, moe=moe, mla=mla, **v)
    return out


@cache
def perf_defaults() -> dict[str, float]:
    return {k: float(v) for k, v in _read("perf.yaml").items()}


def lookup(kind: str, name: str, key: str):
    """Find a catalogue entry or fail naming the config key and the allowed values."""
    table = gpu_catalogue() if kind == "gpu" else model_catalogue()
    if name not in table:
        raise ValueError(f"{key}={name!r} is not in configs/catalogue/{kind}s.yaml; "
                         f"allowed: {', '.join(sorted(table))}")
    return table[name]

"""The model for CPU runs: a tiny random-weight Qwen3, built locally at first use and cached.

There is no hub access on the development machines, and weight values do not change timing (output
lengths are forced with `ignore_eos` + `max_tokens`), so a random model of the right architecture is
enough. Shapes (Qwen3 architecture, scaled down): vocab 4096, hidden 256, 4 layers, 4 heads, 2 KV
heads, head_dim 64 (~3.4M parameters, 14 MB in float32). No tokenizer: servers run with
`--skip-tokenizer-init` and prompts are token ids.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

TINY_QWEN3 = dict(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, intermediate_size=512, max_position_embeddings=8192,
                  tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
CACHE_DIR = Path(os.environ.get("PRORSA_CACHE", Path.home() / ".cache" / "prorsa-harness"))


def tiny_qwen3(cache_dir: str | os.PathLike | None = None, dtype: str = "float32", seed: int = 0) -> Path:
    """The directory of the tiny Qwen3 (config.json + model.safetensors), built on first use."""
    spec = {**TINY_QWEN3, "dtype": dtype, "seed": seed}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    root = Path(cache_dir or CACHE_DIR)
    out = root / f"qwen3-tiny-{dtype}-{key}"
    if (out / "config.json").exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:          # parallel test workers build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "config.json").exists():
            _build(out, dtype, seed)
    return out


def _build(out: Path, dtype: str, seed: int) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    torch_dtype = getattr(torch, dtype)
    model = Qwen3ForCausalLM(Qwen3Config(**TINY_QWEN3, torch_dtype=dtype)).to(torch_dtype)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    os.replace(tmp, out)


if __name__ == "__main__":
    print(tiny_qwen3())

"""Prorsa on settings no part of it was tuned on: other families, sizes, clusters, engine semantics and
modes than REPRODUCE.md's experiments. Per setting it runs colocation, every fixed split and Prorsa
(one Hydra multirun each, so a rerun skips what is complete) and prints Prorsa against
`hindsight_best` (the fastest of colocation and the fixed splits, chosen after the fact), a row per
setting and seed, also written to OUT/summary.csv (the file REPRODUCE.md's table is rendered from).
  python scripts/generalization.py [OUT] [--only NAME ...] [--seeds 0,1]"""
import argparse
import json
import logging
import re
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.experiment import write_atomic  # noqa: E402
from harness.sweep import unnamed  # noqa: E402

log = logging.getLogger("generalization")

# name -> overrides. Lengths and sizes are illustrative settings, chosen before any run, not fitted.
# The second group (from browse_moe16_sync on) was chosen after the first had been used to fix Prorsa,
# to judge those fixes on settings they were not made on: other cluster sizes (4 and 16 engines),
# SGLang in async, kv_both switching in async, long contexts, many short turns.
SETTINGS: dict[str, list[str]] = {
    "reasoning_moe_sync": ["workload=reasoning", "cluster=moe_h200"],
    "browse_dense8_sync": ["workload=browse", "cluster=dense8_h100"],
    "synth_pages_sglang_sync": ["workload=synthetic", "cluster=moe_h200_sglang", "workload.batch_size=32",
                                "workload.tool_output.median=3000", "workload.output.median=200"],
    "synth_prompts_dense32_sync": ["workload=synthetic", "cluster=dense_h100", "workload.batch_size=32",
                                   "workload.prompt.median=6000", "workload.output.median=80",
                                   "workload.tool_output.median=2000"],
    "synth_decode_moe_sync": ["workload=synthetic", "cluster=moe_h200", "workload.batch_size=32",
                              "workload.output.median=1500", "workload.tool_output.median=200"],
    "tooluse_sglang_sync": ["workload=tooluse", "cluster=moe_h200_sglang"],
    "search_long_moe_async": ["workload=search_long", "cluster=moe_h200", "mode=async", "mode.num_steps=2",
                              "mode.max_in_flight=256"],
    "mix_reason_browse_dense8_async": ["workload=mix_reason_browse", "cluster=dense8_h100", "mode=async",
                                       "mode.max_in_flight=256"],
    "browse_moe16_sync": ["workload=browse", "cluster=moe_h200", "cluster.num_engines=16"],
    "tooluse_dense4_sync": ["workload=tooluse", "cluster=dense_h100", "cluster.num_engines=4"],
    "search_sglang_async": ["workload=search", "cluster=moe_h200_sglang", "mode=async", "mode.max_in_flight=256"],
    "reasoning_dense8_async": ["workload=reasoning", "cluster=dense8_h100", "mode=async",
                               "mode.max_in_flight=256"],
    "synth_longctx_dense8_sync": ["workload=synthetic", "cluster=dense8_h100", "workload.batch_size=32",
                                  "workload.prompt.median=12000", "workload.output.median=300",
                                  "workload.tool_output.median=500"],
    "synth_manyturns_moe_async": ["workload=synthetic", "cluster=moe_h200", "mode=async", "mode.max_in_flight=256",
                                  "workload.batch_size=32", "workload.turns.0.median=15", "workload.output.median=100",
                                  "workload.tool_output.median=400", "workload.tool_latency.0.median=0.5"],
    "browse_kvboth_moe_async": ["workload=browse", "cluster=moe_h200", "cluster.switch_mechanism=kv_both",
                                "mode=async", "mode.max_in_flight=256"],
    "mix_sglang_sync": ["workload=mix", "cluster=moe_h200_sglang"],
    # Third group, chosen before its first run, after every fix the first two led to: clusters of the
    # paper's kind with prefill-heavy turns, 12 engines, drain switching, SGLang and kv_both in async.
    "browse_deepseek_sync": ["workload=browse", "cluster=deepseek_v3_h200"],
    "browse_qwen235_sglang_sync": ["workload=browse", "cluster=qwen235_h200", "cluster.engine=sglang"],
    "reasoning_sglang_async": ["workload=reasoning", "cluster=moe_h200_sglang", "mode=async",
                               "mode.max_in_flight=256"],
    "search_long_dense32_sync": ["workload=search_long", "cluster=dense_h100"],
    "tooluse_moe12_kvboth_async": ["workload=tooluse", "cluster=moe_h200", "cluster.num_engines=12",
                                   "cluster.switch_mechanism=kv_both", "mode=async", "mode.max_in_flight=256"],
    "mix_reason_browse_moe_sync": ["workload=mix_reason_browse", "cluster=moe_h200"],
    "synth_answers_dense8_async": ["workload=synthetic", "cluster=dense8_h100", "mode=async",
                                   "mode.max_in_flight=128", "workload.batch_size=32",
                                   "workload.output.median=2000", "workload.tool_output.median=1000"],
    "browse_drain_sglang_async": ["workload=browse", "cluster=moe_h200_sglang", "cluster.switch_mechanism=drain",
                                  "mode=async", "mode.max_in_flight=256"],
    # Fourth group, chosen before its first run, after the sync check: drain and kv_both switching on
    # dense engines without DP attention, in async.
    "browse_dense8_drain_async": ["workload=browse", "cluster=dense8_h100", "cluster.switch_mechanism=drain",
                                  "mode=async", "mode.max_in_flight=128"],
    "tooluse_dense8_kvboth_async": ["workload=tooluse", "cluster=dense8_h100", "cluster.switch_mechanism=kv_both",
                                    "mode=async", "mode.max_in_flight=128"],
    # Fifth group, chosen before its first run: two trace families no generator of the repo makes
    # (write_traces; replayed, so every seed runs the same trajectories and only Prorsa's own draws
    # change), a paper-kind cluster on decode-heavy reasoning, SWE on the MoE cluster with SGLang's steps,
    # SGLang in async with mid-sized pages.
    "analyst_moe_sync": ["workload=trace", "workload.path={traces}/analyst.jsonl", "workload.batch_size=64",
                         "cluster=moe_h200"],
    "review_sglang_sync": ["workload=trace", "workload.path={traces}/review.jsonl", "workload.batch_size=64",
                           "cluster=moe_h200_sglang"],
    "reasoning_qwen235_sync": ["workload=reasoning", "cluster=qwen235_h200"],
    "swe_moe_sglang_sync": ["workload=swe", "cluster=moe_h200_sglang"],
    "analyst_dense8_async": ["workload=trace", "workload.path={traces}/analyst.jsonl", "workload.batch_size=64",
                             "cluster=dense8_h100", "mode=async", "mode.max_in_flight=256"],
    "review_dense32_async": ["workload=trace", "workload.path={traces}/review.jsonl", "workload.batch_size=64",
                             "cluster=dense_h100", "mode=async", "mode.max_in_flight=128"],
    "synth_sglang_async": ["workload=synthetic", "cluster=moe_h200_sglang", "mode=async", "mode.max_in_flight=256",
                           "workload.batch_size=32", "workload.prompt.median=3000",
                           "workload.tool_output.median=1500", "workload.output.median=400"],
    # Sixth group, chosen before its first run: a retrieval agent's trace (~8k-token documents per
    # turn, ~150-token answers) on the paper-kind Qwen3-235B cluster and on moe_h200 in async, and a
    # trace of two families in every step (the retrieval and the analyst agents) with SGLang's steps
    # and on DeepSeek-V3 with SGLang in async.
    "rag_qwen235_sync": ["workload=trace", "workload.path={traces}/rag.jsonl", "workload.batch_size=64",
                         "cluster=qwen235_h200"],
    "rag_moe_async": ["workload=trace", "workload.path={traces}/rag.jsonl", "workload.batch_size=64",
                      "cluster=moe_h200", "mode=async", "mode.max_in_flight=256"],
    "rag_analyst_sglang_sync": ["workload=trace", "workload.path={traces}/rag_analyst.jsonl", "workload.batch_size=64",
                                "cluster=moe_h200_sglang"],
    "rag_analyst_deepseek_async": ["workload=trace", "workload.path={traces}/rag_analyst.jsonl",
                                   "workload.batch_size=64", "cluster=deepseek_v3_h200", "cluster.engine=sglang",
                                   "mode=async", "mode.max_in_flight=256"],
    # Seventh group, chosen before its first run: code generation (long answers, short test output)
    # on dense TP4 engines; a shopping-style agent of ~20 short actions on 1.5k-token pages on the
    # paper-kind Qwen3-235B cluster with SGLang's steps; the reasoning -> long-search curriculum on the
    # same cluster in async; browsing on four DeepSeek-V3 engines in async.
    "synth_code_dense32_sync": ["workload=synthetic", "cluster=dense_h100", "workload.batch_size=32",
                                "workload.output.median=2500", "workload.tool_output.median=300",
                                "workload.turns.0.median=4"],
    "synth_webshop_qwen235_sglang_sync": ["workload=synthetic", "cluster=qwen235_h200", "cluster.engine=sglang",
                                          "workload.batch_size=32", "workload.max_turns=30",
                                          "workload.turns.0.median=20", "workload.output.median=40",
                                          "workload.tool_output.median=1500", "workload.tool_latency.0.median=0.3"],
    "mix_reason_search_long_qwen235_async": ["workload=mix_reason_search_long", "cluster=qwen235_h200",
                                             "mode=async", "mode.max_in_flight=256"],
    "browse_deepseek4_async": ["workload=browse", "cluster=deepseek_v3_h200", "cluster.num_engines=4",
                               "mode=async", "mode.max_in_flight=128"],
    # Eighth group, chosen and committed before its first run: a 20k-token shared task prompt with short
    # turns (prefix cache); long math reasoning with a short interpreter call on the paper-kind Qwen3-235B
    # cluster in async; SWE on DeepSeek-V3 with kv_both switching in async; browsing on dense engines
    # with SGLang's steps; a triage agent (a trace family with two kinds of trajectory) on moe_h200.
    "synth_sharedprompt_moe_sync": ["workload=synthetic", "cluster=moe_h200", "workload.batch_size=32",
                                    "workload.prompt.median=20000", "workload.prompt.high=60000",
                                    "workload.context_cap=98304", "workload.output.median=150",
                                    "workload.tool_output.median=300"],
    "synth_math_qwen235_async": ["workload=synthetic", "cluster=qwen235_h200", "mode=async",
                                 "mode.max_in_flight=256", "workload.batch_size=32", "workload.turns.0.median=3",
                                 "workload.output.median=3000", "workload.max_output_tokens=16384",
                                 "workload.tool_output.median=100", "workload.tool_latency.0.median=1.0"],
    "swe_deepseek_kvboth_async": ["workload=swe", "cluster=deepseek_v3_h200", "cluster.switch_mechanism=kv_both",
                                  "mode=async", "mode.max_in_flight=128"],
    "browse_dense8_sglang_sync": ["workload=browse", "cluster=dense8_h100", "cluster.engine=sglang"],
    "triage_moe_sync": ["workload=trace", "workload.path={traces}/triage.jsonl", "workload.batch_size=64",
                        "cluster=moe_h200"],
    # Ninth group, chosen and committed before its first run, after Prorsa learned to draw a trace's
    # recorded trajectories: two more trace families whose turns depend on their position (a coding
    # agent alternating edits and test runs, then a patch; a research agent whose deep trajectories read
    # many long pages), and the triage trace on SGLang in async.
    "coder_dense8_sync": ["workload=trace", "workload.path={traces}/coder.jsonl", "workload.batch_size=64",
                          "cluster=dense8_h100"],
    "survey_qwen235_async": ["workload=trace", "workload.path={traces}/survey.jsonl", "workload.batch_size=64",
                             "cluster=qwen235_h200", "mode=async", "mode.max_in_flight=256"],
    "triage_sglang_async": ["workload=trace", "workload.path={traces}/triage.jsonl", "workload.batch_size=64",
                            "cluster=moe_h200_sglang", "mode=async", "mode.max_in_flight=256"],
    # Tenth group, chosen and committed before its first run: a verifier agent (a trace family whose
    # first turn is a long solution and whose later turns are short checks on long checker reports) on
    # the paper-kind DeepSeek-V3 cluster in sync and on dense engines with kv_both switching in async; a
    # tool-bound synthetic run in async (15-s tools: little for any split to gain); browsing on six
    # engines with SGLang's mixed chunks.
    "verifier_deepseek_sync": ["workload=trace", "workload.path={traces}/verifier.jsonl", "workload.batch_size=64",
                               "cluster=deepseek_v3_h200"],
    "verifier_dense8_kvboth_async": ["workload=trace", "workload.path={traces}/verifier.jsonl",
                                     "workload.batch_size=64", "cluster=dense8_h100",
                                     "cluster.switch_mechanism=kv_both", "mode=async", "mode.max_in_flight=256"],
    "synth_toolbound_moe_async": ["workload=synthetic", "cluster=moe_h200", "mode=async", "mode.max_in_flight=256",
                                  "workload.batch_size=32", "workload.tool_latency.0.median=15",
                                  "workload.tool_output.median=1500", "workload.output.median=300"],
    "browse_moe6_mixedchunk_sync": ["workload=browse", "cluster=moe_h200_sglang", "cluster.num_engines=6",
                                    "cluster.enable_mixed_chunk=true"],
    # Eleventh group, chosen and committed before its first run: a trace whose family flips every batch
    # (retrieval, then a math solver, twice) replayed in async with kv_both switching, where no mix is
    # declared per batch; the research agent's long contexts on dense engines in sync (KV-bound); the
    # verifier on 16 dense engines (15 splits); SWE on four DeepSeek-V3 engines.
    "flip_rag_solver_kvboth_async": ["workload=trace", "workload.path={traces}/flip_rag_solver.jsonl",
                                     "workload.batch_size=32", "cluster=moe_h200", "cluster.switch_mechanism=kv_both",
                                     "mode=async", "mode.num_steps=4", "mode.max_in_flight=256"],
    "survey_dense8_sync": ["workload=trace", "workload.path={traces}/survey.jsonl", "workload.batch_size=64",
                           "cluster=dense8_h100"],
    "verifier_dense16_sync": ["workload=trace", "workload.path={traces}/verifier.jsonl", "workload.batch_size=64",
                              "cluster=dense8_h100", "cluster.num_engines=16"],
    "swe_deepseek4_sync": ["workload=swe", "cluster=deepseek_v3_h200", "cluster.num_engines=4"],
    # Twelfth group, chosen and committed before its first run: the flipping trace in sync (each step
    # one family, the next step's undeclared) and in async with SGLang's drain switch; the verifier on
    # the paper-kind Qwen3-235B cluster in async.
    "flip_rag_solver_sync": ["workload=trace", "workload.path={traces}/flip_rag_solver.jsonl",
                             "workload.batch_size=32", "cluster=moe_h200", "cluster.switch_mechanism=kv_both",
                             "mode.num_steps=4"],
    "flip_rag_solver_drain_sglang_async": ["workload=trace", "workload.path={traces}/flip_rag_solver.jsonl",
                                           "workload.batch_size=32", "cluster=moe_h200_sglang",
                                           "cluster.switch_mechanism=drain", "mode=async", "mode.num_steps=4",
                                           "mode.max_in_flight=256"],
    "verifier_qwen235_async": ["workload=trace", "workload.path={traces}/verifier.jsonl", "workload.batch_size=64",
                               "cluster=qwen235_h200", "mode=async", "mode.max_in_flight=256"],
    # Thirteenth group, chosen and committed before its first run: two new trace families, a planner
    # agent (a long repository map, then many short actions on short observations) on the paper-kind
    # Qwen3-235B cluster in sync, and a browser that sometimes dumps a whole page (a heavy-tailed tool
    # output) in async with kv_both switching and on ten SGLang engines with the drain switch in sync;
    # both families in every step on the DeepSeek-V3 cluster in async.
    "planner_qwen235_sync": ["workload=trace", "workload.path={traces}/planner.jsonl", "workload.batch_size=64",
                             "cluster=qwen235_h200"],
    "dumper_kvboth_async": ["workload=trace", "workload.path={traces}/dumper.jsonl", "workload.batch_size=64",
                            "cluster=moe_h200", "cluster.switch_mechanism=kv_both", "mode=async",
                            "mode.max_in_flight=256"],
    "dumper_sglang10_drain_sync": ["workload=trace", "workload.path={traces}/dumper.jsonl", "workload.batch_size=64",
                                   "cluster=moe_h200_sglang", "cluster.num_engines=10",
                                   "cluster.switch_mechanism=drain"],
    "planner_dumper_deepseek_async": ["workload=trace", "workload.path={traces}/planner_dumper.jsonl",
                                      "workload.batch_size=64", "cluster=deepseek_v3_h200", "mode=async",
                                      "mode.max_in_flight=256"],
    # Fourteenth group, chosen and committed before its first run: two new trace families, a debate agent
    # (long answers, each met by an opponent model's long rebuttal after ~2 s: as much prefill as decode)
    # in async with kv_both switching, and a text-to-SQL agent (a long schema, short queries, a result
    # table that is large three times in ten) on dense8 in sync and on the paper-kind DeepSeek-V3 cluster
    # in async with the drain switch; both families in every step on Qwen3-235B with SGLang's steps.
    "debater_kvboth_async": ["workload=trace", "workload.path={traces}/debater.jsonl", "workload.batch_size=64",
                             "cluster=moe_h200", "cluster.switch_mechanism=kv_both", "mode=async",
                             "mode.max_in_flight=256"],
    "sql_dense8_sync": ["workload=trace", "workload.path={traces}/sql.jsonl", "workload.batch_size=64",
                        "cluster=dense8_h100"],
    "sql_deepseek_drain_async": ["workload=trace", "workload.path={traces}/sql.jsonl", "workload.batch_size=64",
                                 "cluster=deepseek_v3_h200", "cluster.switch_mechanism=drain", "mode=async",
                                 "mode.max_in_flight=256"],
    "sql_debater_qwen235_sglang_sync": ["workload=trace", "workload.path={traces}/sql_debater.jsonl",
                                        "workload.batch_size=64", "cluster=qwen235_h200", "cluster.engine=sglang"],
    # Fifteenth group, chosen and committed before its first run, on cluster sizes and shapes the
    # fourteenth's families have not met: the debater on dense8 in sync and on four SGLang engines with
    # the drain switch in sync; SQL on 32 engines of moe_h200 in async (31 splits); both families on
    # dense TP4 engines in async with kv_both switching.
    "debater_dense8_sync": ["workload=trace", "workload.path={traces}/debater.jsonl", "workload.batch_size=64",
                            "cluster=dense8_h100"],
    "debater_sglang4_drain_sync": ["workload=trace", "workload.path={traces}/debater.jsonl", "workload.batch_size=64",
                                   "cluster=moe_h200_sglang", "cluster.num_engines=4",
                                   "cluster.switch_mechanism=drain"],
    "sql_moe32_async": ["workload=trace", "workload.path={traces}/sql.jsonl", "workload.batch_size=64",
                        "cluster=moe_h200", "cluster.num_engines=32", "mode=async", "mode.max_in_flight=512"],
    "sql_debater_dense_kvboth_async": ["workload=trace", "workload.path={traces}/sql_debater.jsonl",
                                       "workload.batch_size=64", "cluster=dense_h100",
                                       "cluster.switch_mechanism=kv_both", "mode=async", "mode.max_in_flight=256"],
    # Sixteenth group, chosen and committed before its first run: GPUs no setting ran on before (the
    # catalogue's H20, a seventh of an H100's compute at 1.2x its memory bandwidth; the A100; the H800,
    # whose NVLink is about a third of the H100's) and a model with full multi-head attention
    # (Llama-2-7B: 3.6 times Qwen3-8B's KV bytes per token: 32 KV heads in 32 layers against 8 in 36).
    "browse_h20_dense8_sync": ["workload=browse", "cluster=dense8_h100", "cluster.gpu=h20"],
    "tooluse_a100_llama_async": ["workload=tooluse", "cluster=dense8_h100", "cluster.gpu=a100",
                                 "cluster.model=llama2_7b", "mode=async", "mode.max_in_flight=256"],
    "swe_h800_moe_sync": ["workload=swe", "cluster=moe_h200", "cluster.gpu=h800"],
    "rag_h20_dense32_kvboth_async": ["workload=trace", "workload.path={traces}/rag.jsonl", "workload.batch_size=64",
                                     "cluster=dense_h100", "cluster.gpu=h20", "cluster.switch_mechanism=kv_both",
                                     "mode=async", "mode.max_in_flight=256"],
}
ENGINES = 8  # every cluster preset's size; a setting may override it with cluster.num_engines


def write_traces(directory: Path) -> None:
    """Agent families as JSONL traces (workloads/trace.py), 128 prompts x 8 samples each, a prompt's
    samples sharing it, and two traces that mix them; illustrative shapes, not fitted to anything:
    - analyst (a data-analysis agent): a 2,500-token task; per turn a short tool call (~60 tokens, 70%)
      or a long analysis (~900 tokens, 30%), then a table of ~2,500 tokens after ~2 s; 2-14 turns
      (1 + geometric(0.15), capped), so values pile up at the cap: multimodal outputs and turn counts;
    - review (a code-review agent): a ~12k-token diff with its files; 2-4 turns of ~400-token answers,
      ~300-token tool outputs after ~0.8 s (exponential);
    - rag (a retrieval agent): a ~600-token question; 2-5 turns of ~150-token answers, each followed by
      ~8k tokens of retrieved documents after ~0.3 s;
    - rag_analyst: both of those families in every step, 64 groups of each, alternating;
    - triage (a support-triage agent): a ~1k-token ticket; 40% of trajectories answer at once (~600
      tokens, one turn), the rest investigate: 6-12 turns of ~80-token actions on ~5k-token logs after
      ~1 s, so a step holds short and long chains of one family;
    - coder (a coding agent): a ~6k-token task with its files; 3-9 turns alternating an edit (~400
      tokens, a ~50-token acknowledgement after ~0.1 s) and a test command (~30 tokens, a ~2k-token log
      after ~4 s), the last turn a ~1.5k-token patch;
    - survey (a research agent): a ~800-token question; 30% of trajectories go deep (10-16 turns of
      ~200-token queries on ~6k-token pages), the rest shallow (2-4 turns of ~400 tokens on ~1k-token
      pages); every trajectory's last turn is a ~2k-token report;
    - verifier (a solve-then-check agent): a ~1.5k-token problem; a ~2.5k-token solution first, then 2-6
      checks of ~100 tokens, each answered by a ~3k-token checker report after ~1.5 s, and a ~300-token
      final answer;
    - solver (a math agent with an interpreter): a ~400-token problem; 1-3 turns of ~3k-token reasoning,
      each followed by a ~100-token interpreter result after ~1 s;
    - flip_rag_solver: 32 groups of rag, 32 of solver, 32 of rag, 32 of solver (other groups of each),
      so that with batch_size=32 the family flips every batch;
    - planner (a planning agent on a large repository): a ~16k-token repository map; 8-20 turns of
      ~40-token actions, each answered by a ~150-token observation after ~0.1 s; a ~600-token summary;
    - dumper (a browser that sometimes dumps a whole page): a ~1.2k-token question; 4-10 turns of
      ~250-token answers, after ~0.5 s a ~100-token tool output (85%) or a ~15k-token page (15%);
    - planner_dumper: both of those families in every step, 64 groups of each, alternating;
    - debater (a debate agent against an opponent model): a ~500-token motion; 3-6 turns of ~1.5k-token
      arguments, each answered by a ~1.5k-token rebuttal after ~2 s; a ~300-token closing statement;
    - sql (a text-to-SQL agent): a ~4k-token schema; 3-8 turns of ~120-token queries, each answered after
      ~0.3 s by a result table of ~200 tokens (70%) or ~6k tokens (30%); a ~200-token answer;
    - sql_debater: both of those families in every step, 64 groups of each, alternating."""
    rng = np.random.default_rng(2026)

    def lognormal(median: float, sigma: float, low: int, high: int) -> int:
        return int(np.clip(median * np.exp(sigma * rng.standard_normal()), low, high))

    def chain(group: int, family: str, prompt: int, turns: int, draw) -> dict:
        """A trajectory of `turns` turns; `draw()` gives a turn's (output, tool output, tool latency),
        each family drawing them in its own order."""
        out, new = [], prompt
        for _ in range(turns):
            output, tool, latency = draw()
            out.append({"new_tokens": new, "output_tokens": output, "tool_output_tokens": tool,
                        "tool_latency_s": round(float(latency), 3)})
            new = tool
        return {"group": group, "family": family, "turns": out}

    def analyst(group: int, prompt: int) -> dict:
        def draw():
            output = lognormal(60, 0.4, 8, 400) if rng.random() < 0.7 else lognormal(900, 0.5, 100, 4000)
            return output, lognormal(2500, 0.8, 50, 12000), 2.0 * np.exp(0.6 * rng.standard_normal())
        return chain(group, "analyst", prompt, min(1 + int(rng.geometric(0.15)), 14), draw)

    def review(group: int, prompt: int) -> dict:
        def draw():
            tool = lognormal(300, 0.7, 20, 3000)
            return lognormal(400, 0.6, 20, 3000), tool, rng.exponential(0.8)
        return chain(group, "review", prompt, int(rng.integers(2, 5)), draw)

    def rag(group: int, prompt: int) -> dict:
        def draw():
            tool = lognormal(8000, 0.35, 1000, 20000)
            return lognormal(150, 0.5, 10, 1500), tool, 0.3 * np.exp(0.5 * rng.standard_normal())
        return chain(group, "rag", prompt, int(rng.integers(2, 6)), draw)

    def triage(group: int, prompt: int) -> dict:
        if rng.random() < 0.4:
            return chain(group, "triage", prompt, 1, lambda: (lognormal(600, 0.4, 50, 3000), 0, 0.0))

        def draw():
            return lognormal(80, 0.5, 10, 800), lognormal(5000, 0.5, 500, 16000), np.exp(0.5 * rng.standard_normal())
        return chain(group, "triage", prompt, int(rng.integers(6, 13)), draw)

    directory.mkdir(parents=True, exist_ok=True)

    def write(name: str, rows: list[dict]) -> None:
        (directory / f"{name}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in rows))

    groups = {}
    for name, make, prompt in (("analyst", analyst, (2500, 0.3, 500, 8000)), ("review", review, (12000, 0.4, 3000, 28000)),
                               ("rag", rag, (600, 0.3, 100, 3000))):
        if name == "rag":
            rng = np.random.default_rng(7)   # its own stream: added after the first two, which stay as they were
        groups[name] = []
        for group in range(128):
            shared = lognormal(*prompt)
            groups[name].append([make(group, shared) for _ in range(8)])
        write(name, [t for g in groups[name] for t in g])

    def positional(group: int, family: str, prompt: int, turns: list[tuple[int, int, float]],
                   answer: tuple[float, float, int, int]) -> dict:
        """A trajectory from its turns' (output, tool output, tool latency), drawn by position, then a
        final answer of `lognormal(*answer)` tokens that calls no tool (drawn after the turns)."""
        turns = turns + [(lognormal(*answer), 0, 0.0)]
        return chain(group, family, prompt, len(turns), iter(turns).__next__)

    def coder(group: int, prompt: int) -> dict:
        n = int(rng.integers(3, 10))
        turns = []
        for k in range(n - 1):
            if k % 2 == 0:
                turns.append((lognormal(400, 0.5, 20, 3000), lognormal(50, 0.3, 5, 400), 0.1 * np.exp(0.3 * rng.standard_normal())))
            else:
                turns.append((lognormal(30, 0.4, 5, 200), lognormal(2000, 0.6, 100, 12000), 4.0 * np.exp(0.4 * rng.standard_normal())))
        return positional(group, "coder", prompt, turns, (1500, 0.4, 200, 6000))

    def survey(group: int, prompt: int) -> dict:
        deep = rng.random() < 0.3
        n = int(rng.integers(10, 17)) if deep else int(rng.integers(2, 5))
        turns = [(lognormal(200, 0.5, 10, 2000), lognormal(6000, 0.4, 1000, 16000), 0.5 * np.exp(0.5 * rng.standard_normal()))
                 if deep else (lognormal(400, 0.5, 10, 3000), lognormal(1000, 0.5, 100, 6000), 0.5 * np.exp(0.5 * rng.standard_normal()))
                 for _ in range(n - 1)]
        return positional(group, "survey", prompt, turns, (2000, 0.4, 200, 8000))

    def verifier(group: int, prompt: int) -> dict:
        def report():   # a checker report's tokens and latency
            return lognormal(3000, 0.5, 200, 12000), 1.5 * np.exp(0.5 * rng.standard_normal())
        turns = [(lognormal(2500, 0.5, 200, 12000), *report())]
        turns += [(lognormal(100, 0.5, 10, 800), *report()) for _ in range(int(rng.integers(2, 7)))]
        return positional(group, "verifier", prompt, turns, (300, 0.4, 20, 2000))

    def solver(group: int, prompt: int) -> dict:
        def draw():
            return lognormal(3000, 0.5, 200, 16000), lognormal(100, 0.5, 5, 1000), np.exp(0.4 * rng.standard_normal())
        return chain(group, "solver", prompt, int(rng.integers(1, 4)), draw)

    def planner(group: int, prompt: int) -> dict:
        turns = [(lognormal(40, 0.5, 5, 400), lognormal(150, 0.6, 10, 2000), 0.1 * np.exp(0.5 * rng.standard_normal()))
                 for _ in range(int(rng.integers(8, 21)) - 1)]
        return positional(group, "planner", prompt, turns, (600, 0.4, 50, 3000))

    def dumper(group: int, prompt: int) -> dict:
        def page() -> int:
            return lognormal(15000, 0.3, 4000, 30000) if rng.random() < 0.15 else lognormal(100, 0.5, 5, 1000)
        turns = [(lognormal(250, 0.5, 10, 2000), page(), 0.5 * np.exp(0.6 * rng.standard_normal()))
                 for _ in range(int(rng.integers(4, 11)) - 1)]
        return positional(group, "dumper", prompt, turns, (500, 0.4, 50, 3000))

    def debater(group: int, prompt: int) -> dict:
        turns = [(lognormal(1500, 0.4, 100, 6000), lognormal(1500, 0.4, 100, 6000), 2.0 * np.exp(0.5 * rng.standard_normal()))
                 for _ in range(int(rng.integers(3, 7)) - 1)]
        return positional(group, "debater", prompt, turns, (300, 0.4, 20, 2000))

    def sql(group: int, prompt: int) -> dict:
        def table() -> int:
            return lognormal(6000, 0.4, 1000, 16000) if rng.random() < 0.3 else lognormal(200, 0.6, 10, 2000)
        turns = [(lognormal(120, 0.5, 10, 800), table(), 0.3 * np.exp(0.8 * rng.standard_normal()))
                 for _ in range(int(rng.integers(3, 9)) - 1)]
        return positional(group, "sql", prompt, turns, (200, 0.4, 20, 1500))

    for name, make, prompt, stream in (("triage", triage, (1000, 0.3, 200, 4000), 11),
                                       ("coder", coder, (6000, 0.3, 1000, 20000), 13),
                                       ("survey", survey, (800, 0.3, 100, 3000), 17),
                                       ("verifier", verifier, (1500, 0.3, 300, 5000), 19),
                                       ("solver", solver, (400, 0.3, 50, 2000), 23),
                                       ("planner", planner, (16000, 0.3, 4000, 40000), 29),
                                       ("dumper", dumper, (1200, 0.3, 200, 5000), 31),
                                       ("debater", debater, (500, 0.3, 100, 2000), 37),
                                       ("sql", sql, (4000, 0.3, 1000, 12000), 41)):
        rng = np.random.default_rng(stream)   # each its own stream: added after the others, which stay as they were
        rows = []
        for group in range(128):
            shared = lognormal(*prompt)
            rows += [make(group, shared) for _ in range(8)]
        groups[name] = [rows[8 * g:8 * g + 8] for g in range(128)]
        write(name, rows)

    def alternating(renumbered: str, kept: str) -> list[dict]:
        """Both families in every step, alternating groups: 64 of each, the first one's renumbered."""
        return [t for g in range(64) for t in [dict(x, group=1000 + g) for x in groups[renumbered][g]] + groups[kept][g]]

    write("rag_analyst", alternating("analyst", "rag"))
    # the family flips every 32 groups: rag 0-31, solver 0-31 (renumbered), rag 32-63, solver 32-63
    flip = [dict(t, group=g + 1000 * (name == "solver")) for block in range(2) for name in ("rag", "solver")
            for g in range(32 * block, 32 * block + 32) for t in groups[name][g]]
    write("flip_rag_solver", flip)
    write("planner_dumper", alternating("planner", "dumper"))
    write("sql_debater", alternating("sql", "debater"))


def splits(overrides: list[str]) -> str:
    """Every P:D split of the setting's cluster, 1 .. engines-1 prefill engines."""
    n = next((int(o.split("=")[1]) for o in overrides if o.startswith("cluster.num_engines=")), ENGINES)
    return ",".join(str(k) for k in range(1, n))


def sweep(out: Path, overrides: list[str], seeds: str, prorsa: bool = True) -> None:
    """Colocation, Prorsa (unless `prorsa` is false) and every fixed split at each seed. A replayed trace
    runs the same trajectories at every seed, so there Prorsa's own sampling stream (`policy.seed`)
    follows the seed: the seeds then differ in Prorsa's draws, as they would not otherwise."""
    # job directories named by the policy and seed only (the setting's directory says the rest)
    cmd = [sys.executable, "run.py", "-m", f"hydra.sweep.dir={out}", "logger=none", f"seed={seeds}", *overrides]
    fixed = ["policy=fixed_pd", f"policy.num_prefill={splits(overrides)}"]
    runs = [["policy=colocate,prorsa" if prorsa else "policy=colocate"], fixed]
    if "workload=trace" in overrides:
        # a replay's static runs are the same at every seed: run them at the first (table() reuses them)
        first = f"seed={seeds.split(',')[0]}"
        runs = [["policy=colocate", first], *([["policy=prorsa", "policy.seed=${seed}"]] if prorsa else []), fixed + [first]]
    for policy in runs:
        named = overrides + [o for o in policy if o.startswith("policy.seed=")]   # named by the seed already
        seed = [o for o in policy if o.startswith("seed=")]
        job = [o for o in cmd if not (seed and o.startswith("seed="))] + policy
        rc = subprocess.run(job + [unnamed(named)], cwd=Path(__file__).parent.parent).returncode
        if rc != 0:
            log.warning("%s: a job failed (exit %d); the others are kept", out.name, rc)


def table(out: Path, statics_only: Collection[str] = ()) -> list[dict]:
    """One row per setting and seed; a setting of `statics_only` without Prorsa's columns."""
    rows = []
    for d in sorted(p for p in out.iterdir() if p.is_dir()):
        statics_only_here = d.name in statics_only
        runs = [(s.parent.name, json.loads(s.read_text())) for s in d.glob("*/summary.json")]
        replay = sorted(r["seed"] for _, r in runs if r["workload"] == "trace" and r["policy"] == "colocate")
        for seed in sorted({r["seed"] for _, r in runs}):
            by = {_label(job, r): r for job, r in runs if r["seed"] == seed}
            if "colocate" not in by and replay:   # a replay's static runs, made at one seed
                by = {**{_label(job, r): r for job, r in runs if r["seed"] == replay[0]}, **by}
            if "colocate" not in by or ("prorsa" not in by and not statics_only_here):
                continue
            static = {k: v["rollout_time_s"] for k, v in by.items() if k != "prorsa"}
            best = min(static, key=static.get)
            p = by.get("prorsa")   # None: a setting run without Prorsa
            rows.append({"setting": d.name, "seed": seed, "colocate_s": round(static["colocate"], 1),
                         "best": best, "best_s": round(static[best], 1),
                         "prorsa_s": round(p["rollout_time_s"], 1) if p else None,
                         "switches": p.get("num_role_switches", 0) if p else None,
                         "prorsa/best": round(static[best] / p["rollout_time_s"], 3) if p else None,
                         "best/colocate": round(static["colocate"] / static[best], 3)})
    return rows


def _label(job_dir: str, summary: dict) -> str:
    """A fixed split by its prefill count, read from the job directory (Hydra's override_dirname)."""
    split = re.search(r"policy\.num_prefill=(\d+)", job_dir)
    return f"{split.group(1)}P" if split else summary["policy"]


def main(settings: dict[str, list[str]] = SETTINGS, default_out: str = "results/generalization",
         doc: str = __doc__, statics_only: Collection[str] = ()) -> None:
    """Runs `settings` (name -> overrides; those in `statics_only` without Prorsa) and prints Prorsa
    against `hindsight_best` per setting and seed (scripts/paper_clusters.py and recipe_loads.py run
    their own settings through this)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("out", nargs="?", default=default_out)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    traces = (out / "traces").resolve()
    for name, overrides in settings.items():
        if args.table_only or (args.only and name not in args.only):
            continue
        paths = [Path(o.split("=", 1)[1].format(traces=traces)) for o in overrides if "{traces}" in o]
        if not all(path.exists() for path in paths):
            write_traces(traces)
        sweep(out / name, [o.format(traces=traces) for o in overrides], args.seeds, prorsa=name not in statics_only)
    rows = table(out, statics_only)
    if rows:
        write_atomic(out / "summary.csv", lambda tmp: pd.DataFrame(rows).to_csv(tmp, index=False))
        cols = list(rows[0])
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(str(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()

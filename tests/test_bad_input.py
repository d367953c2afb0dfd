"""Bad input through the command line: every config group and trace files. Each case stops the run before
anything is simulated, with a message naming the key (`key=value is invalid; allowed: ...`, or
`file:line: field '...'` for a trace line), no traceback, and nothing written: not even the run directory.

The cases run run.py as `__main__` with their arguments (the code path of `python run.py ...`), all in one
child Python process so the interpreter starts once; a few also run as a process of their own.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]   # kept for child processes
SMALL = ["workload.batch_size=4", "workload.group_size=2", "mode.num_steps=1", "logger=none",
         "progress_interval_s=0"]

# (case id, overrides after SMALL, what the message must hold: the key, and the value where it has one)
CONFIG_CASES = [
    ("num_engines_float", ["cluster.num_engines=2.5"], "cluster.num_engines=2.5 is invalid; allowed: an integer >= 1"),
    ("num_engines_bool", ["cluster.num_engines=true"], "cluster.num_engines=True is invalid; allowed: an integer >= 1"),
    ("gpus_per_engine", ["cluster.gpus_per_engine=0"], "cluster.gpus_per_engine=0 is invalid; allowed: an integer >= 1"),
    ("max_num_batched_tokens", ["cluster.max_num_batched_tokens=0"], "cluster.max_num_batched_tokens=0 is invalid"),
    ("max_num_seqs", ["cluster.max_num_seqs=-1"], "cluster.max_num_seqs=-1 is invalid; allowed: an integer >= 1"),
    ("memory_fraction_text", ["cluster.memory_fraction=high"], "cluster.memory_fraction='high' is invalid; allowed: (0, 1]"),
    ("activation_reserve", ["cluster.activation_reserve_bytes=-1"], "cluster.activation_reserve_bytes=-1 is invalid"),
    ("kv_transfer_setup", ["cluster.kv_transfer_setup_s=-0.1"], "cluster.kv_transfer_setup_s=-0.1 is invalid"),
    ("weight_dtype", ["++cluster.weight_dtype=fp4"], "cluster.weight_dtype='fp4' is invalid; allowed: bf16, fp8"),
    ("weight_dtype_gpu", ["cluster.gpu=a100", "++cluster.weight_dtype=fp8"], "cluster.weight_dtype='fp8' is invalid; allowed: bf16 on a100"),
    ("switch_time_text", ["cluster.switch_time_s=abc"], "cluster.switch_time_s='abc' is invalid; allowed: a number >= 0"),
    ("reshard_switch_time", ["cluster.reshard_switch_time_s=-5"], "cluster.reshard_switch_time_s=-5 is invalid"),
    ("engine", ["cluster.engine=trt"], "cluster.engine='trt' is invalid; allowed: vllm, sglang"),
    ("switch_mechanism", ["cluster.switch_mechanism=teleport"],
     "cluster.switch_mechanism='teleport' is invalid; allowed: kv_both, drain, reshard"),
    ("chunked_prefill_size", ["cluster.chunked_prefill_size=0"], "cluster.chunked_prefill_size=0 is invalid"),
    ("cuda_graph_max_bs", ["cluster.cuda_graph_max_bs=-1"], "cluster.cuda_graph_max_bs=-1 is invalid"),
    ("enable_mixed_chunk", ["cluster.enable_mixed_chunk=maybe"], "cluster.enable_mixed_chunk='maybe' is invalid; allowed: true, false"),
    ("flush_prefix_cache", ["cluster.flush_prefix_cache_on_weight_update=2"],
     "cluster.flush_prefix_cache_on_weight_update=2 is invalid; allowed: true, false"),
    ("reset_prefix_cache", ["cluster.reset_prefix_cache_on_switch=maybe"],
     "cluster.reset_prefix_cache_on_switch='maybe' is invalid; allowed: true, false"),
    ("router_update", ["cluster.router_update_s=-1"], "cluster.router_update_s=-1 is invalid; allowed: a number >= 0"),
    ("router_balance_abs", ["cluster.router_balance_abs_requests=-1"],
     "cluster.router_balance_abs_requests=-1 is invalid; allowed: an integer >= 0"),
    ("router_balance_rel", ["cluster.router_balance_rel=0.5"], "cluster.router_balance_rel=0.5 is invalid; allowed: a number >= 1"),
    ("cost_model", ["cluster.cost_model=magic"], "cluster.cost_model='magic' is invalid; allowed: roofline, profiled"),
    ("profile_missing", ["cluster.cost_model=profiled"], "cluster.profile=None is invalid; allowed: a profile file path"),
    ("profile_no_file", ["cluster.cost_model=profiled", "cluster.profile=/nonexistent/profile.json"],
     "cluster.profile='/nonexistent/profile.json' is invalid; allowed: an existing profile file"),
    ("parallelism_null", ["cluster.parallelism=null"], "cluster.parallelism=None is invalid; allowed: a mapping"),
    ("parallelism_role_text", ["cluster.parallelism.prefill=abc"], "cluster.parallelism.prefill='abc' is invalid"),
    ("parallelism_tp_text", ["cluster.parallelism.prefill.tp=abc"],
     "cluster.parallelism.prefill.tp='abc' is invalid; allowed: an integer >= 1"),
    ("parallelism_dp_zero", ["cluster.parallelism.decode.dp=0"], "cluster.parallelism.decode.dp=0 is invalid; allowed: an integer >= 1"),
    ("parallelism_ep_int", ["cluster.parallelism.decode.ep=1"], "cluster.parallelism.decode.ep=1 is invalid; allowed: true, false"),
    ("parallelism_unknown", ["+cluster.parallelism.prefill.pp=2"], "cluster.parallelism.prefill.pp=2 is invalid; allowed: one of dp, ep, tp"),
    ("perf_unknown", ["+cluster.perf.magic=1"], "cluster.perf.magic=1 is invalid; allowed: gemm_mfu"),
    ("perf_negative", ["+cluster.perf.gemm_mfu=-1"], "cluster.perf.gemm_mfu=-1 is invalid; allowed: a number > 0"),
    ("perf_text", ["+cluster.perf.overhead_per_step_s=abc"], "cluster.perf.overhead_per_step_s='abc' is invalid"),
    ("cluster_name_null", ["cluster.name=null"], "cluster.name=None is invalid; allowed: a non-empty string"),
    ("cluster_key_deleted", ["~cluster.gpu"], "cluster.gpu=None is invalid; allowed: a value (the key is required)"),
    ("one_engine_split", ["cluster.num_engines=1", "policy=fixed_pd"], "a P/D split needs cluster.num_engines >= 2"),
    ("reactive_negative_dwell", ["policy=reactive_pd", "policy.min_dwell_s=-1"], "policy.min_dwell_s=-1 is invalid"),
    ("num_steps_float", ["mode.num_steps=1.5"], "mode.num_steps=1.5 is invalid; allowed: an integer >= 1"),
    ("num_steps_text", ["mode.num_steps=abc"], "mode.num_steps='abc' is invalid; allowed: an integer >= 1"),
    ("num_steps_list", ["mode.num_steps=[1,2]"], "mode.num_steps=[1, 2] is invalid"),
    ("mode_name", ["mode.name=semi"], "mode.name='semi' is invalid; allowed: sync, async"),
    ("max_in_flight_zero", ["mode=async", "mode.max_in_flight=0"], "mode.max_in_flight=0 is invalid; allowed: an integer >= 1"),
    ("max_in_flight_text", ["mode=async", "mode.max_in_flight=abc"], "mode.max_in_flight='abc' is invalid"),
    ("staleness", ["mode=async", "mode.staleness=-1"], "mode.staleness=-1 is invalid; allowed: an integer >= 0"),
    ("mode_unknown_key", ["+mode.foo=1"], "mode.foo=1 is invalid; allowed: one of max_concurrency, max_in_flight, name, num_steps, request_rate, staleness"),
    ("batch_size_float", ["workload.batch_size=1.5"], "workload.batch_size=1.5 is invalid; allowed: an integer >= 1"),
    ("group_size_zero", ["workload.group_size=0"], "workload.group_size=0 is invalid; allowed: an integer >= 1"),
    ("turns_median_text", ["workload.turns.0.median=abc"], "workload.turns[0].median='abc' is invalid; allowed: a number > 0"),
    ("max_turns", ["workload.max_turns=0"], "workload.max_turns=0 is invalid; allowed: an integer >= 1"),
    ("prompt_median", ["workload.prompt.median=-1"], "workload.prompt.median=-1 is invalid; allowed: a number > 0"),
    ("output_sigma", ["workload.output.sigma=-1"], "workload.output.sigma=-1 is invalid; allowed: a number >= 0"),
    ("context_cap", ["workload.context_cap=0"], "workload.context_cap=0 is invalid; allowed: an integer >= 1"),
    ("max_output_tokens", ["workload.max_output_tokens=0"], "workload.max_output_tokens=0 is invalid"),
    ("drift_text", ["workload.drift.output_per_step=abc"], "workload.drift.output_per_step='abc' is invalid; allowed: a number > -1"),
    ("workload_unknown_key", ["+workload.foo=1"], "workload.foo=1 is invalid; allowed: one of batch_size, context_cap, drift, family"),
    ("group_score_corr", ["workload.group_score_corr=1.5"], "workload.group_score_corr=1.5 is invalid; allowed: [-1, 1]"),
    ("group_corr", ["workload=swe", "workload.group_corr=2"], "workload.group_corr=2 is invalid; allowed: [0, 1]"),
    ("num_prefill_text", ["policy=fixed_pd", "policy.num_prefill=abc"], "policy.num_prefill='abc' is invalid"),
    ("ppd_num_prefill", ["policy=ppd", "policy.num_prefill=9"], "policy.num_prefill=9 is invalid; allowed: an integer in [1, 7]"),
    ("reactive_kv_high", ["policy=reactive_pd", "policy.decode_kv_high=1.5"], "policy.decode_kv_high=1.5 is invalid; allowed: (0, 1]"),
    ("reactive_queue", ["policy=reactive_pd", "policy.prefill_queue_low=99999999"],
     "policy.prefill_queue_low=99999999 is invalid; allowed: <= policy.prefill_queue_high (32768)"),
    ("reactive_interval", ["policy=reactive_pd", "policy.control_interval_s=0"],
     "policy.control_interval_s=0 is invalid; allowed: a number > 0"),
    ("prorsa_bins", ["policy=prorsa", "policy.bins=0"], "policy.bins=0 is invalid; allowed: an integer >= 1"),
    ("prorsa_initial", ["policy=prorsa", "policy.initial=foo"], "policy.initial='foo' is invalid; allowed: plan, colocated"),
    ("prorsa_plan_latency_negative", ["policy=prorsa", "policy.plan_latency=-1"],
     "policy.plan_latency=-1 is invalid; allowed: model, or a number of seconds >= 0"),
    ("prorsa_plan_latency_text", ["policy=prorsa", "policy.plan_latency=soon"],
     "policy.plan_latency='soon' is invalid; allowed: model, or a number of seconds >= 0"),
    ("prorsa_plan_events_zero", ["policy=prorsa", "policy.plan_events_per_s=0"],
     "policy.plan_events_per_s=0 is invalid; allowed: a number > 0"),
    ("prorsa_priors", ["policy=prorsa", "policy.priors=bogus"], "policy.priors='bogus' is invalid; allowed: workload, none"),
    ("prorsa_switch_rule", ["policy=prorsa", "policy.switch_rule=cusum"],
     "policy.switch_rule='cusum' is invalid; allowed: consecutive, evidence"),
    ("prorsa_plan_workers_zero", ["policy=prorsa", "policy.plan_workers=0"],
     "policy.plan_workers=0 is invalid; allowed: auto, or an integer >= 1"),
    ("prorsa_plan_workers_text", ["policy=prorsa", "policy.plan_workers=many"],
     "policy.plan_workers='many' is invalid; allowed: auto, or an integer >= 1"),
    ("prorsa_plan_per_engine_zero", ["policy=prorsa", "policy.plan_per_engine=0"],
     "policy.plan_per_engine=0 is invalid; allowed: an integer >= 1 or null (every trajectory)"),
    ("prorsa_plan_per_engine_forecast_work", ["policy=prorsa", "policy.plan_per_engine=8",
                                              "policy.placement=forecast_work"],
     "policy.plan_per_engine=8 is invalid with policy.placement=forecast_work; allowed: null"),
    ("prorsa_plan_engines_one", ["policy=prorsa", "policy.plan_engines=1"],
     "policy.plan_engines=1 is invalid; allowed: an integer >= 2"),
    ("prorsa_prefill_scale_zero", ["policy=prorsa", "policy.model.prefill_scale=0"],
     "policy.model.prefill_scale=0 is invalid; allowed: a number > 0"),
    ("prorsa_decode_scale_negative", ["policy=prorsa", "policy.model.decode_scale=-1.25"],
     "policy.model.decode_scale=-1.25 is invalid; allowed: a number > 0"),
    ("prorsa_model_cost_model", ["policy=prorsa", "policy.model.cost_model=oracle"],
     "policy.model.cost_model='oracle' is invalid; allowed: roofline, profiled"),
    ("prorsa_model_profile_missing", ["policy=prorsa", "policy.model.cost_model=profiled",
                                      "policy.model.profile=/nonexistent/profile.json"],
     "policy.model.profile='/nonexistent/profile.json' is invalid; allowed: an existing profile file"),
    ("prorsa_model_profile_unparseable", ["policy=prorsa", "policy.model.cost_model=profiled",
                                          f"policy.model.profile={ROOT / 'README.md'}"],
     "policy.model.profile=" + repr(str(ROOT / "README.md")) + " is invalid; allowed: a profile file with prefill"),
    ("prorsa_model_perf_unknown", ["policy=prorsa", "policy.model.perf={magic: 1}"],
     "policy.model.perf.magic=1 is invalid; allowed: gemm_mfu"),
    ("prorsa_model_perf_zero", ["policy=prorsa", "policy.model.perf={gemm_mfu: 0}"],
     "policy.model.perf.gemm_mfu=0 is invalid; allowed: a number > 0"),
    ("pearl_fit_points", ["policy=pearl", "policy.min_fit_points=0"], "policy.min_fit_points=0 is invalid"),
    ("oracle_interval", ["policy=oracle_pd", "policy.decision_interval_s=0"], "policy.decision_interval_s=0 is invalid"),
    ("policy_unknown_key", ["+policy.foo=1"], "policy.foo=1 is invalid; baselines.colocate.Colocate takes no keys"),
    ("prorsa_unknown_key", ["policy=prorsa", "+policy.horizon=5"],
     "policy.horizon=5 is invalid; did you mean policy.horizon_s? allowed: one of"),
    ("seed_negative", ["seed=-1"], "seed=-1 is invalid; allowed: an integer >= 0"),
    ("seed_text", ["seed=abc"], "seed='abc' is invalid; allowed: an integer >= 0"),
    ("seed_float", ["seed=1.5"], "seed=1.5 is invalid; allowed: an integer >= 0"),
    ("sample_interval_zero", ["sample_interval_s=0"], "sample_interval_s=0 is invalid; allowed: a number >= 0.01"),
    ("sample_interval_text", ["sample_interval_s=abc"], "sample_interval_s='abc' is invalid; allowed: a number >= 0.01"),
    ("progress_interval", ["progress_interval_s=-1"], "progress_interval_s=-1 is invalid; allowed: a number >= 0"),
    ("added_top_level_key", ["+foo=1"], "foo=1 is invalid; allowed: one of backend, cluster, logger, mode, policy"),
    ("backend_name", ["backend.name=foo"], "backend.name='foo' is invalid; allowed: sim"),
    ("fast_forward", ["backend.fast_forward=maybe"], "backend.fast_forward='maybe' is invalid; allowed: true, false"),
    ("logger_name", ["logger.name=foo"], "logger.name='foo' is invalid; allowed: none"),
    ("logger_rows", ["logger=wandb", "logger.max_table_rows=-1"], "logger.max_table_rows=-1 is invalid; allowed: an integer >= 0"),
    ("logger_tags", ["logger=wandb", "logger.tags=notalist"], "logger.tags='notalist' is invalid; allowed: a list of strings"),
    ("logger_unknown_key", ["logger=wandb", "+logger.foo=1"], "logger.foo=1 is invalid; allowed: one of"),
    # Type errors, each caught by its group's schema (harness/schema.py) with the key named.
    ("prorsa_horizon_text", ["policy=prorsa", "policy.horizon_s=abc"],
     "policy.horizon_s='abc' is invalid; allowed: a number > 0"),
    ("prorsa_bins_float", ["policy=prorsa", "policy.bins=2.5"], "policy.bins=2.5 is invalid; allowed: an integer >= 1"),
    ("prorsa_forecast_text", ["policy=prorsa", "policy.forecast=maybe"],
     "policy.forecast='maybe' is invalid; allowed: true, false"),
    ("prorsa_priority", ["policy=prorsa", "policy.priority=lifo"],
     "policy.priority='lifo' is invalid; allowed: fcfs, remaining_work"),
    ("pearl_hysteresis_text", ["policy=pearl", "policy.hysteresis=abc"],
     "policy.hysteresis='abc' is invalid; allowed: a number >= 0"),
    ("oracle_colocated_int", ["policy=oracle_pd", "policy.allow_colocated=1"],
     "policy.allow_colocated=1 is invalid; allowed: true, false"),
    ("fixed_pd_float", ["policy=fixed_pd", "policy.num_prefill=1.5"],
     "policy.num_prefill=1.5 is invalid; allowed: an integer"),
    ("logger_tables_int", ["logger=wandb", "logger.tables=3"], "logger.tables=3 is invalid; allowed: true, false"),
    ("logger_mode", ["logger=wandb", "logger.mode=cloud"],
     "logger.mode='cloud' is invalid; allowed: offline, online, disabled"),
    ("fast_forward_int", ["backend.fast_forward=1"], "backend.fast_forward=1 is invalid; allowed: true, false"),
    ("backend_unknown_key", ["+backend.foo=1"], "backend.foo=1 is invalid; allowed: one of fast_forward, name"),
    ("vllm_time_scale", ["backend=vllm_cpu", "backend.time_scale=0"],
     "backend.time_scale=0 is invalid; allowed: a number > 0"),
    ("vllm_removed_switch_time", ["backend=vllm_cpu", "+backend.switch_time_s=2"],
     "backend.switch_time_s=2 is no longer a key here: the switch is priced and waited as the cluster's switch "
     "mechanism says (cluster.switch_mechanism; kv_both: cluster.router_update_s); remove it"),
    ("vllm_ray_enabled", ["backend=vllm_cpu", "backend.ray.enabled=maybe"],
     "backend.ray.enabled='maybe' is invalid; allowed: true, false"),
    ("staleness_text", ["mode=async", "mode.staleness=abc"], "mode.staleness='abc' is invalid; allowed: an integer >= 0"),
    ("tp_float", ["cluster.parallelism.prefill.tp=1.5"],
     "cluster.parallelism.prefill.tp=1.5 is invalid; allowed: an integer >= 1"),
    ("agent_prompt_median_text", ["workload=swe", "workload.prompt.median=abc"],
     "workload.prompt.median='abc' is invalid; allowed: a number > 0"),
    ("agent_turn_weight", ["workload=swe", "workload.turns.0.weight=-1"],
     "workload.turns[0].weight=-1 is invalid; allowed: a number >= 0"),
    ("agent_turn_modes_per", ["workload=tooluse", "workload.turn_modes_per=prompt"],
     "workload.turn_modes_per='prompt' is invalid; allowed: sample, group"),
    ("mix_component_text", ["workload=mix", "workload.components.swe.max_turns=abc"],
     "workload.components.swe.max_turns='abc' is invalid; allowed: an integer >= 1"),
    ("synthetic_name_empty", ["workload.name=''"], "workload.name='' is invalid; allowed: a non-empty string"),
    # Beyond what a day or the hardware allows: refused, not run for ever (the periodic ticks).
    ("sample_interval_tiny", ["sample_interval_s=1e-6"],
     "sample_interval_s=1e-06 is invalid; allowed: a number >= 0.01 and <= 86400"),
    ("sample_interval_huge", ["sample_interval_s=1e9"], "sample_interval_s=1000000000.0 is invalid"),
    ("kv_setup_absurd", ["cluster.kv_transfer_setup_s=1e12"],
     "cluster.kv_transfer_setup_s=1000000000000.0 is invalid; allowed: a number >= 0 and <= 3600"),
    ("switch_time_absurd", ["cluster.switch_time_s=1e5"], "cluster.switch_time_s=100000.0 is invalid"),
    ("reshard_time_absurd", ["cluster.reshard_switch_time_s=1e300"], "cluster.reshard_switch_time_s=1e+300 is invalid"),
    ("router_update_absurd", ["cluster.router_update_s=7200"], "cluster.router_update_s=7200 is invalid"),
    ("batch_size_absurd", ["workload.batch_size=100000000"],
     "workload.batch_size=100000000 is invalid; allowed: an integer >= 1 and <= 65536"),
    ("group_size_absurd", ["workload.group_size=1000000"], "workload.group_size=1000000 is invalid"),
    ("tool_latency_absurd", ["workload=swe", "workload.tool_latency.0.median=1e308"],
     "workload.tool_latency[0].median=1e+308 is invalid; allowed: a number > 0 and <= 86400"),
    ("tool_latency_cap_absurd", ["workload=swe", "workload.tool_latency.0.high=1e12"],
     "workload.tool_latency[0].high=1000000000000.0 is invalid"),
    ("mix_batch_absurd", ["workload=mix", "workload.batch_size=100000000"], "workload.batch_size=100000000 is invalid"),
    # `_target_`s resolved as Hydra's instantiate resolves them, its blocklist included (aliases too).
    ("backend_target_blocklisted", ["backend._target_=os.system"],
     "backend._target_='os.system' is invalid; allowed: an importable class that Hydra's instantiate accepts "
     "(Target 'os.system' is blocklisted"),
    ("backend_target_alias", ["backend._target_=logging.os.system"],
     "backend._target_='logging.os.system' is invalid; allowed: an importable class that Hydra's instantiate "
     "accepts (Target 'os.system' (resolved from 'logging.os.system') is blocklisted"),
    ("backend_target_unknown", ["backend._target_=nonexistent.Backend"],
     "backend._target_='nonexistent.Backend' is invalid; allowed: an importable class that Hydra's instantiate "
     "accepts (Error locating target 'nonexistent.Backend'"),
    ("policy_target_blocklisted", ["policy._target_=subprocess.Popen"],
     "policy._target_='subprocess.Popen' is invalid; allowed: an importable class that Hydra's instantiate"),
    ("workload_target_blocklisted", ["workload._target_=builtins.exec"],
     "workload._target_='builtins.exec' is invalid; allowed: an importable class that Hydra's instantiate"),
    ("logger_target_blocklisted", ["logger._target_=os.system"],
     "logger._target_='os.system' is invalid; allowed: an importable class that Hydra's instantiate"),
    # A group option or top-level key that does not exist, before Hydra composes (harness/cli.py
    # check_overrides): one line with the closest allowed name.
    ("unknown_top_level", ["foo=1"], "foo=1 is invalid: no group or key 'foo'; allowed: one of policy,"),
    ("misspelt_group", ["polcy=prorsa"], "polcy=prorsa is invalid: no group or key 'polcy'; did you mean policy?"),
    ("unknown_option", ["cluster=nonexistent"], "cluster=nonexistent is invalid; allowed: one of cpu_small,"),
    ("misspelt_option", ["workload=swee"], "workload=swee is invalid; did you mean workload=swe? allowed: one of"),
    ("experiment_without_plus", ["experiment=swe"], "experiment=swe is invalid; an experiment is added: +experiment=swe"),
    # A key inside a group that the composed config lacks (the group's chosen option, after +experiment and
    # in every option a sweep picks): the key closest at that level, or the option that has it.
    ("unknown_key", ["cluster.num_engine=8"], "cluster.num_engine=8 is invalid: no key 'num_engine' in cluster "
                                              "(cluster=dense_h100); did you mean cluster.num_engines? allowed: one of"),
    ("misspelt_policy_key", ["policy=prorsa", "policy.hysterisis=0.1"],
     "policy.hysterisis=0.1 is invalid: no key 'hysterisis' in policy (policy=prorsa); did you mean policy.hysteresis?"),
    ("key_of_another_mode", ["mode.max_inflight=3"], "mode.max_inflight=3 is invalid: no key 'max_inflight' in mode "
                                                     "(mode=sync); did you mean mode.max_in_flight, with mode=async?"),
    ("misspelt_key_after_experiment", ["+experiment=tooluse_async", "mode.max_inflight=3"],
     "mode.max_inflight=3 is invalid: no key 'max_inflight' in mode (mode=async); did you mean mode.max_in_flight?"),
    ("misspelt_nested_key", ["cluster.parallelism.prefil.tp=2"], "cluster.parallelism.prefil.tp=2 is invalid: no key "
     "'prefil' in cluster.parallelism (cluster=dense_h100); did you mean cluster.parallelism.prefill?"),
    ("misspelt_nested_leaf", ["cluster.parallelism.decode.dpp=2"], "cluster.parallelism.decode.dpp=2 is invalid: no "
     "key 'dpp' in cluster.parallelism.decode (cluster=dense_h100); did you mean cluster.parallelism.decode.dp?"),
    ("key_not_in_config", ["cluster.perf.foo=1"], "cluster.perf.foo=1 is invalid: no key 'foo' in cluster.perf "
                                                  "(cluster=dense_h100); allowed: none, or a key added with a '+': "
                                                  "+cluster.perf.foo=1"),
    ("sweep_misspelt_key", ["-m", "cluster.num_engine=4,8"], "cluster.num_engine=4,8 is invalid: no key 'num_engine' "
                                                             "in cluster (cluster=dense_h100); did you mean "
                                                             "cluster.num_engines?"),
    ("sweep_key_not_in_every_option", ["-m", "policy=prorsa,colocate", "policy.hysteresis=0.1"],
     "policy.hysteresis=0.1 is invalid: no key 'hysteresis' in policy (policy=colocate); did you mean "
     "policy.hysteresis, with policy=pearl, policy=prorsa?"),
    # Rejected by Hydra while composing the config (its message, no traceback, nothing run).
    ("wrong_type_merge", ["workload=mix", "workload.components=[]"], "Error merging override workload.components=[]"),
]

GOOD = {"group": 0, "family": "swe", "turns": [
    {"new_tokens": 100, "output_tokens": 20, "tool_latency_s": 1.5, "tool_output_tokens": 30},
    {"new_tokens": 30, "output_tokens": 10, "tool_latency_s": 0.0, "tool_output_tokens": 0}]}


def turn0(**fields) -> dict:
    return {**GOOD, "group": 1, "turns": [{**GOOD["turns"][0], **fields}, GOOD["turns"][1]]}


# (case id, lines after a good first line (text, or an object written as JSON), expected after "FILE")
TRACE_CASES = [
    ("truncated_line", ['{"group": 1, "family": "swe", "turns": [{"new_tok'], ":2: not valid JSON"),
    ("array_line", [[1, 2]], ":2: expected a JSON object, got list"),
    ("turns_text", [{**GOOD, "group": 1, "turns": "many"}], ":2: field 'turns': expected a non-empty list"),
    ("turn_number", [{**GOOD, "group": 1, "turns": [7]}], ":2: field 'turns[0]': expected an object"),
    ("family_number", [{**GOOD, "group": 1, "family": 3}], ":2: field 'family': expected a string"),
    ("max_output_zero", [{**GOOD, "group": 1, "max_output_tokens": 0}], ":2: field 'max_output_tokens'"),
    ("latency_nan", [turn0(tool_latency_s=math.nan)], ":2: field 'turns[0].tool_latency_s'"),
    ("latency_infinite", [turn0(tool_latency_s=math.inf)], ":2: field 'turns[0].tool_latency_s'"),
    ("new_tokens_float", [turn0(new_tokens=1e3)], ":2: field 'turns[0].new_tokens'"),
    ("first_prompt_empty", [turn0(new_tokens=0)], ":2: field 'turns[0].new_tokens'"),
    ("misspelt_line_key", [{**GOOD, "group": 1, "turn": []}], ":2: field 'turn': unknown"),
    ("unequal_groups", ["", {**GOOD, "group": 1}, {**GOOD, "group": 1}], ":3: field 'group': group 1 has 2"),
    # Limits: duplicate keys, numbers within bounds, nesting, encoding (workloads/trace.py).
    ("duplicate_line_key", ['{"group": 1, "family": "swe", "family": "tooluse", "turns": []}'],
     ":2: field 'family': appears twice in one object"),
    ("duplicate_turn_key", [json.dumps(turn0()).replace('"output_tokens": 20', '"output_tokens": 20, "output_tokens": 5')],
     ":2: field 'output_tokens': appears twice in one object"),
    ("new_tokens_400_digits", [json.dumps(turn0()).replace('"new_tokens": 100', '"new_tokens": ' + "9" * 400)],
     ":2: field 'turns[0].new_tokens': expected an integer >= 1 and <= 10000000, got an integer of 400 digits"),
    ("latency_400_digits", [json.dumps(turn0()).replace('"tool_latency_s": 1.5', '"tool_latency_s": ' + "9" * 400)],
     ":2: field 'turns[0].tool_latency_s': expected a finite number >= 0 and <= 86400"),
    ("integer_beyond_digit_limit", [json.dumps(turn0()).replace('"new_tokens": 100', '"new_tokens": ' + "9" * 5000)],
     ":2: not valid JSON"),
    ("latency_1e308", [turn0(tool_latency_s=1e308)], ":2: field 'turns[0].tool_latency_s': expected a finite number"),
    ("latency_negative", [turn0(tool_latency_s=-1)], ":2: field 'turns[0].tool_latency_s'"),
    ("output_tokens_absurd", [turn0(output_tokens=10 ** 12)], ":2: field 'turns[0].output_tokens'"),
    ("max_output_absurd", [{**GOOD, "group": 1, "max_output_tokens": 10 ** 15}], ":2: field 'max_output_tokens'"),
    ("tool_output_text", [turn0(tool_output_tokens="many")], ":2: field 'turns[0].tool_output_tokens'"),
    ("nesting_100000_deep", ["[" * 100000 + "]" * 100000], ":2: nested too deeply"),
    ("nesting_40_deep", [{**GOOD, "group": 1, "turns": [{**GOOD["turns"][0], "x": json.loads("[" * 40 + "]" * 40)}]}],
     ":2: nested too deeply"),
    ("not_utf8", [b'{"group": 1, "family": "sw\xff", "turns": []}'], ":2: not UTF-8 (byte 0xff"),
    ("not_utf8_later_line", ["", "", b"\xc3\x28"], ":4: not UTF-8"),
    ("group_null", [{**GOOD, "group": None}], ":2: field 'group': expected an integer or a string"),
    ("turns_missing", [{"group": 1, "family": "swe"}], ":2: field 'turns': missing"),
]
# Whole-file problems, named by the file.
TRACE_FILE_CASES = [
    ("empty_file", lambda d: (d / "empty.jsonl", "\n\n"), ": no trajectories"),
    ("missing_file", lambda d: (d / "missing.jsonl", None), ": no such trace file"),
    ("directory", lambda d: (d, None), ": no such trace file"),
]

# Profile files (cluster.profile, cluster.contended_profile, Prorsa's policy.model.profile): (case id, the
# file's content (text or bytes; None: the path is a directory), what the message must hold after
# `KEY='PATH' is invalid; allowed: `). Each file is tried under each key.
PROFILE_ROW = {"prefill": [{"new_tokens": 100, "cached_tokens": 0, "seconds": 0.01}],
               "decode": [{"batch": 1, "context": 100, "seconds": 0.001}]}
PROFILE_ROWS = "a profile file with prefill and decode rows (python -m harness.calibrate writes one): "
PROFILE_CASES = [
    ("profile_not_json", "not a profile\n", PROFILE_ROWS + "not JSON (line 1 column 1: Expecting value)"),
    ("profile_truncated", json.dumps(PROFILE_ROW)[:40], PROFILE_ROWS + "not JSON (line 1 column 34: Unterminated string"),
    ("profile_empty_file", "", PROFILE_ROWS + "not JSON"),
    ("profile_not_utf8", b'{"prefill": "\xff"}', PROFILE_ROWS + "not UTF-8 (byte 0xff at offset 13)"),
    ("profile_empty_object", "{}", PROFILE_ROWS + "key 'prefill' is missing, not a non-empty list"),
    ("profile_a_list", "[]", PROFILE_ROWS + "it holds a JSON list, not an object"),
    ("profile_empty_lists", '{"prefill": [], "decode": []}', PROFILE_ROWS + "key 'prefill' is [], not a non-empty list"),
    ("profile_no_decode", json.dumps({"prefill": PROFILE_ROW["prefill"]}),
     PROFILE_ROWS + "key 'decode' is missing, not a non-empty list"),
    ("profile_row_not_object", json.dumps({**PROFILE_ROW, "prefill": [1]}),
     PROFILE_ROWS + "prefill[0]=1 is not an object with keys new_tokens, cached_tokens, seconds"),
    ("profile_row_key_missing", json.dumps({**PROFILE_ROW, "decode": [{"batch": 1, "seconds": 0.001}]}),
     PROFILE_ROWS + "decode[0].context is missing, not a number >= 0 and <= 1e+07"),
    ("profile_row_text", json.dumps({**PROFILE_ROW, "prefill": [{"new_tokens": 1, "cached_tokens": 0,
                                                                  "seconds": "fast"}]}),
     PROFILE_ROWS + "prefill[0].seconds is 'fast', not a number >= 0 and <= 86400"),
    ("profile_row_negative", json.dumps({**PROFILE_ROW, "decode": [{"batch": -1, "context": 1, "seconds": 1}]}),
     PROFILE_ROWS + "decode[0].batch is -1, not a number >= 0 and <= 1e+07"),
    ("profile_row_nan", json.dumps({**PROFILE_ROW, "decode": [{"batch": 1, "context": 1, "seconds": math.nan}]}),
     PROFILE_ROWS + "decode[0].seconds is nan, not a number >= 0 and <= 86400"),
    ("profile_row_huge", json.dumps({**PROFILE_ROW, "prefill": [{"new_tokens": 1e300, "cached_tokens": 0, "seconds": 1}]}),
     PROFILE_ROWS + "prefill[0].new_tokens is 1e+300, not a number >= 0 and <= 1e+07"),
    ("profile_a_directory", None, "an existing profile file (python -m harness.calibrate writes one): Is a directory"),
]
PROFILE_KEYS = {  # key -> the overrides that make the run read the file at PATH under that key
    "cluster.profile": ["cluster.cost_model=profiled", "cluster.profile=PATH"],
    "cluster.contended_profile": ["cluster.cost_model=profiled", "cluster.profile=GOOD", "++cluster.contended_profile=PATH"],
    "policy.model.profile": ["policy=prorsa", "policy.model.cost_model=profiled", "policy.model.profile=PATH"],
}


RUNNER = r"""
import contextlib, io, json, os, runpy, sys
from pathlib import Path
os.environ.setdefault("WANDB_MODE", "offline")
cases_file, results_file = Path(sys.argv[1]), Path(sys.argv[2])
cases, results = json.loads(cases_file.read_text()), {}
for case in cases:
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = ["run.py", *case["argv"]]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path("run.py", run_name="__main__")
        except SystemExit as e:
            code = e.code
        except BaseException as e:   # escaped run.py altogether: reported as such
            import traceback
            err.write("Traceback (escaped run.py)\n" + traceback.format_exc())
            code = "escaped"
    run_dir = Path(case["run_dir"])
    files = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) if run_dir.is_dir() else []
    results[case["id"]] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "files": files}
results_file.write_text(json.dumps(results))
"""


def write_trace(path: Path, lines: list) -> None:
    """A good first line, then `lines`: text, bytes (written as they are) or an object (as JSON)."""
    path.write_bytes(b"".join((l if isinstance(l, bytes) else (l if isinstance(l, str) else json.dumps(l)).encode())
                              + b"\n" for l in [GOOD, *lines]))


def trace_args(path: Path) -> list[str]:
    return ["workload=trace", f"workload.path={path}", "mode.num_steps=1", "logger=none"]


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """Every case run once through run.py; case id -> exit code, stdout, stderr, files in its run directory."""
    base = tmp_path_factory.mktemp("bad_input")
    cases, expected = [], {}
    for cid, overrides, message in CONFIG_CASES:
        cases.append({"id": cid, "argv": [f"hydra.run.dir={base / cid}", f"hydra.sweep.dir={base / cid}", *SMALL,
                                          *overrides]})
        expected[cid] = message
    traces = base / "traces"
    traces.mkdir()
    for cid, lines, tail in TRACE_CASES:
        write_trace(traces / f"{cid}.jsonl", lines)
        cases.append({"id": cid, "argv": [f"hydra.run.dir={base / cid}", *trace_args(traces / f"{cid}.jsonl")]})
        expected[cid] = f"{traces / cid}.jsonl{tail}"
    for cid, make, tail in TRACE_FILE_CASES:
        path, text = make(traces)
        if text is not None:
            path.write_text(text)
        cases.append({"id": cid, "argv": [f"hydra.run.dir={base / cid}", *trace_args(path)]})
        expected[cid] = f"{path}{tail}"
    good = traces / "good.jsonl"
    write_trace(good, [{**GOOD, "group": 1}])
    cases.append({"id": "trace_batch_size", "argv": [f"hydra.run.dir={base / 'trace_batch_size'}", *trace_args(good),
                                                     "workload.batch_size=0"]})
    expected["trace_batch_size"] = "workload.batch_size=0 is invalid; allowed: an integer >= 1 or null"
    cases.append({"id": "trace_without_path", "argv": [f"hydra.run.dir={base / 'trace_without_path'}",
                                                       "workload=trace", "mode.num_steps=1", "logger=none"]})
    expected["trace_without_path"] = "workload.path=??? is invalid; allowed: a value (the key is required"
    cases.append({"id": "prior_is_itself", "argv": [f"hydra.run.dir={base / 'prior_is_itself'}", *trace_args(good),
                                                    f"workload.prior_path={good}"]})
    expected["prior_is_itself"] = f"workload.prior_path='{good}' is invalid; allowed: another trace than workload.path"
    bad_prior = traces / "duplicate_line_key.jsonl"
    cases.append({"id": "prior_is_bad", "argv": [f"hydra.run.dir={base / 'prior_is_bad'}", *trace_args(good),
                                                 f"workload.prior_path={bad_prior}"]})
    expected["prior_is_bad"] = f"{bad_prior}:2: field 'family': appears twice in one object"
    profiles = base / "profiles"
    profiles.mkdir()
    (profiles / "good.json").write_text(json.dumps(PROFILE_ROW))
    for cid, content, tail in PROFILE_CASES:
        path = profiles / f"{cid}.json"
        if content is None:
            path.mkdir()
        else:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
        for key, overrides in PROFILE_KEYS.items():
            kid = f"{cid}:{key}"
            argv = [o.replace("GOOD", str(profiles / "good.json")).replace("PATH", str(path)) for o in overrides]
            cases.append({"id": kid, "argv": [f"hydra.run.dir={base / kid}", *SMALL, *argv]})
            expected[kid] = f"{key}={str(path)!r} is invalid; allowed: {tail}"
    for case in cases:
        case["run_dir"] = str(base / case["id"])
    (base / "cases.json").write_text(json.dumps(cases))
    subprocess.run([sys.executable, "-c", RUNNER, str(base / "cases.json"), str(base / "results.json")], cwd=ROOT,
                   check=True, timeout=600)
    results = json.loads((base / "results.json").read_text())
    return {cid: {**r, "expected": expected[cid]} for cid, r in results.items()}


ALL_IDS = ([c[0] for c in CONFIG_CASES] + [c[0] for c in TRACE_CASES] + [c[0] for c in TRACE_FILE_CASES]
           + ["trace_batch_size", "trace_without_path", "prior_is_itself", "prior_is_bad"]
           + [f"{c[0]}:{key}" for c in PROFILE_CASES for key in PROFILE_KEYS])


def test_enough_distinct_cases():
    assert len(ALL_IDS) == len(set(ALL_IDS)) >= 50


@pytest.mark.parametrize("cid", ALL_IDS)
def test_rejected_with_the_key_named_no_traceback_nothing_written(cli, cid):
    r = cli[cid]
    shown = r["stdout"] + r["stderr"]
    assert r["code"] == 1, shown[-3000:]
    assert r["expected"] in r["stderr"], r["stderr"][-3000:]
    assert "Traceback" not in shown, shown[-3000:]
    assert not r["files"], r["files"]      # no run directory: not even .hydra/, run.log or error.json


@pytest.mark.parametrize("cid", ["memory_fraction_text", "seed_text", "latency_nan", "unknown_key"])
def test_same_as_a_process_of_its_own(tmp_path, cid):
    """`python run.py ...` as its own process says what the batch runner saw."""
    argv = {c[0]: c[1] for c in CONFIG_CASES}.get(cid)
    if argv is None:
        write_trace(tmp_path / f"{cid}.jsonl", {c[0]: c[1] for c in TRACE_CASES}[cid])
        args = trace_args(tmp_path / f"{cid}.jsonl")
        expected = f"{tmp_path / cid}.jsonl:2: field 'turns[0].tool_latency_s'"
    else:
        args = [*SMALL, *argv]
        expected = {c[0]: c[2] for c in CONFIG_CASES}[cid]
    res = subprocess.run([sys.executable, "run.py", f"hydra.run.dir={tmp_path / 'run'}", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and expected in res.stderr, res.stderr[-3000:]
    assert "Traceback" not in res.stdout + res.stderr
    assert not list((tmp_path / "run").glob("*.parquet")) and not (tmp_path / "run" / "summary.json").exists()


def test_a_bad_config_leaves_nothing_in_results(tmp_path):
    """`python run.py` with its default run directory (results/runs/<time>/ under the current directory):
    a bad value, and a misspelt key with the key it likely meant."""
    for args, expected in [(["cluster.num_engines=0"], "cluster.num_engines=0 is invalid; allowed: an integer >= 1"),
                           (["+cluster.num_engine=4"], "cluster.num_engine=4 is invalid; did you mean "
                                                        "cluster.num_engines? allowed: one of"),
                           (["cluster.num_engine=4"], "cluster.num_engine=4 is invalid: no key 'num_engine' in "
                                                      "cluster (cluster=dense_h100); did you mean cluster.num_engines?"),
                           (["-m", "cluster.num_engine=4,8"], "cluster.num_engine=4,8 is invalid: no key 'num_engine' "
                                                              "in cluster (cluster=dense_h100); did you mean "
                                                              "cluster.num_engines?")]:
        res = subprocess.run([sys.executable, str(ROOT / "run.py"), *SMALL, *args], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 1, res.stderr[-3000:]
        assert expected in res.stderr and "Nothing was run or written" in res.stderr, res.stderr[-3000:]
        assert "Traceback" not in res.stdout + res.stderr, res.stderr[-3000:]
        assert not list(tmp_path.iterdir()), list(tmp_path.rglob("*"))


@pytest.mark.parametrize("overrides", [
    ["cluster.parallelism.prefill.tp=2", "cluster.num_engines=4"],
    ["policy=prorsa", "policy.hysteresis=0.1", "policy.model.cost_model=profiled"],
    ["+experiment=tooluse_async", "mode.max_in_flight=3"],       # a key of the group option the experiment picks
    ["-m", "mode=async", "mode.max_in_flight=4,8"],              # a sweep's values
    ["policy=prorsa,pearl", "policy.hysteresis=0.05,0.1"],       # a key of every option a sweep picks
    ["+cluster.foo=1", "++cluster.weight_dtype=fp8", "~cluster.perf"],   # added and removed: Hydra's and the schemas'
    ["workload=swe", "workload.tool_latency.0.median=2"],         # inside a list: Hydra's
    ["hydra.run.dir=/tmp/x", "hydra.job.chdir=false"],
], ids=["nested", "policy_option", "experiment", "sweep_values", "sweep_options", "added", "list", "hydra"])
def test_existing_keys_pass_the_override_check(overrides):
    """What Hydra would compose passes the check before it (harness/cli.py check_overrides) unchanged."""
    from harness.cli import check_overrides
    check_overrides([o for o in overrides if o != "-m"])


# The tools (harness/cli.py: argparse options, Hydra overrides as KEY=VALUE): (module, arguments, what
# stderr must hold). Each stops before any engine is started or file written, with exit status 2.
TOOL_CASES = [
    ("harness.fidelity", [], "--profile FILE or --calibrate GRID is required"),
    ("harness.fidelity", ["--calibrate", "huge"], "argument --calibrate: invalid choice: 'huge'"),
    ("harness.fidelity", ["--calibrate", "quick", "--profile", "p.json"], "--profile='p.json' is invalid with --calibrate"),
    ("harness.fidelity", ["--profile", "p.json", "--seed", "x"], "argument --seed: invalid int value: 'x'"),
    ("harness.fidelity", ["--profile", "p.json", "--seed", "-1"], "--seed=-1 is invalid; allowed: an integer >= 0"),
    ("harness.fidelity", ["--calibrate", "quick", "--contended", "q.json"], "--contended='q.json' is invalid with --calibrate"),
    ("harness.fidelity", ["--profile", "p.json", "--contended", "q.json"],
     "--contended='q.json' is invalid; allowed: an existing profile file"),
    # The older key=value style of a tool's own keys, and an argument that is neither.
    ("harness.fidelity", ["profile=p.json"], "'profile=p.json' is an option of this tool: --profile p.json"),
    ("harness.fidelity", ["seed=3", "--profile", "p.json"], "'seed=3' is an option of this tool: --seed 3"),
    ("harness.calibrate", ["quick"], "'quick' is not an override; allowed: KEY=VALUE"),
    ("harness.calibrate", ["--grid", "huge"], "argument --grid: invalid choice: 'huge'"),
    ("harness.calibrate", ["--engines", "0"], "--engines=0 is invalid; allowed: an integer >= 1"),
    ("harness.calibrate", ["--contended", "maybe"], "'maybe' is not an override"),
    # Overrides naming nothing (harness/cli.py check_overrides), Hydra's refusals and unreadable files, as one line.
    ("harness.calibrate", ["bogus=1"], "harness.calibrate: error: bogus=1 is invalid: no group or key 'bogus'"),
    ("harness.calibrate", ["cluster=nonexistent"], "error: cluster=nonexistent is invalid; allowed: one of"),
    ("harness.fidelity", ["--profile", "missing.json"],
     "--profile='missing.json' is invalid; allowed: an existing profile file (python -m harness.calibrate "
     "writes one): No such file or directory"),
    ("harness.fidelity", ["--profile", str(ROOT / "README.md")],
     f"--profile={str(ROOT / 'README.md')!r} is invalid; allowed: {PROFILE_ROWS}not JSON (line 1 column 1"),
    ("harness.calibrate", ["--refit", str(ROOT / "README.md")],
     f"--refit={str(ROOT / 'README.md')!r} is invalid; allowed: {PROFILE_ROWS}not JSON (line 1 column 1"),
    ("workloads.card", ["workload=swee"], "error: workload=swee is invalid; did you mean workload=swe? allowed:"),
    ("workloads.card", ["workload.batch_size=abc"], "error: workload.batch_size='abc' is invalid; allowed: an integer"),
    ("workloads.card", ["+workload.foo=1"], "error: workload.foo=1 is invalid; allowed: one of"),
    ("workloads.card", ["workload.batchsize=1"], "error: workload.batchsize=1 is invalid: no key 'batchsize' in "
                                                 "workload (workload=synthetic); did you mean workload.batch_size?"),
    ("workloads.card", ["+workload.batchsize=1"], "error: workload.batchsize=1 is invalid; did you mean workload.batch_size?"),
    ("workloads.card", ["workload=trace", "workload.path=missing.jsonl"], "error: missing.jsonl: no such trace file"),
    ("workloads.card", ["--samples", "0"], "error: --samples=0 --steps=1 is invalid; allowed: integers >= 1"),
    ("harness.report", ["missing_dir"], "error: not a directory: missing_dir"),
]


@pytest.mark.parametrize("module,args,expected", TOOL_CASES, ids=[f"{m}:{' '.join(a) or 'none'}" for m, a, _ in TOOL_CASES])
def test_tool_rejects_with_the_key_named_no_traceback(tmp_path, module, args, expected):
    res = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *PYTHONPATH])})
    assert res.returncode == 2, res.stderr[-3000:]
    assert expected in res.stderr and "Traceback" not in res.stdout + res.stderr, res.stderr[-3000:]
    assert res.stderr.startswith("usage: "), res.stderr[-3000:]      # argparse's usage, then the one line
    assert not list(tmp_path.iterdir())


class UserBaseline:
    """A user's own baseline (no schema in harness/schema.py): its keys typed by its constructor."""

    def __init__(self, threshold: int = 3, ratio: float = 0.5, enabled: bool = True, label: str = "mine",
                 engines: list[int] | None = None, anything=None):
        self.threshold = threshold


USER_BASELINE_CASES = [
    ({"threshold": "abc"}, "policy.threshold='abc' is invalid; allowed: an integer"),
    ({"threshold": 2.5}, "policy.threshold=2.5 is invalid; allowed: an integer"),
    ({"ratio": "half"}, "policy.ratio='half' is invalid; allowed: a number"),
    ({"enabled": "maybe"}, "policy.enabled='maybe' is invalid; allowed: true, false"),
    ({"label": 5}, "policy.label=5 is invalid; allowed: a string"),
    ({"engines": [1, "x"]}, "policy.engines[1]='x' is invalid; allowed: an integer"),
    ({"thresold": 4}, "policy.thresold=4 is invalid; did you mean policy.threshold? allowed: one of threshold, ratio, "
                      "enabled, label, engines"),
]


@pytest.mark.parametrize("keys,expected", USER_BASELINE_CASES, ids=[next(iter(k)) + str(i) for i, (k, _) in
                                                                    enumerate(USER_BASELINE_CASES)])
def test_a_users_baseline_gets_its_keys_type_checked(keys, expected):
    from omegaconf import OmegaConf

    from harness.experiment import checked
    with pytest.raises(ValueError) as e:
        checked(OmegaConf.create({"_target_": f"{__name__}.UserBaseline", **keys}), "policy")
    assert str(e.value).startswith(expected), str(e.value)


def test_a_users_baseline_with_good_keys_passes():
    from omegaconf import OmegaConf

    from harness.experiment import checked
    checked(OmegaConf.create({"_target_": f"{__name__}.UserBaseline", "threshold": 4, "ratio": 1, "enabled": False,
                              "label": "x", "engines": [0, 1], "anything": {"a": 1}}), "policy")


# Where a tool writes (an option naming a directory or a file): one it cannot write is refused before any
# work, with the option named. {base}: a read-only directory (a tmpfs mounted read-only) or a regular file.
TOOL_OUTPUT_CASES = [
    ("harness.fidelity", ["--profile", str(ROOT / "results/calibration/vllm_cpu.json"), "--out", "{base}/fid"], "--out"),
    ("harness.fidelity", ["--compare", "{base}/fid"], "--compare"),
    ("harness.calibrate", ["--out", "{base}/profile.json"], "--out"),
    ("harness.calibrate", ["--refit", "{base}/profile.json"], "--refit"),
    ("workloads.card", ["--out", "{base}/cards"], "--out"),
    ("workloads.card", ["--export", "{base}/trace.jsonl", "--no-figure"], "--export"),
    ("harness.report", [str(ROOT / "results"), "--out", "{base}/report"], "--out"),
]


def snapshot(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(d)): (p.lstat().st_mtime_ns, p.lstat().st_size) for p in d.rglob("*")}


def run_tool_writing_to(module: str, args: list[str], base: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *(a.format(base=base) for a in args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *PYTHONPATH])})


@pytest.mark.parametrize("module,args,option", TOOL_OUTPUT_CASES, ids=[f"{m}:{o}" for m, _, o in TOOL_OUTPUT_CASES])
def test_tool_output_under_a_file_is_refused(tmp_path, module, args, option):
    (tmp_path / "a_file").write_text("mine")
    before = snapshot(tmp_path)
    res = run_tool_writing_to(module, args, tmp_path / "a_file", tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    assert f"error: {option}='{tmp_path / 'a_file'}/" in res.stderr, res.stderr[-3000:]
    assert f"({tmp_path / 'a_file'} is not a directory)" in res.stderr, res.stderr[-3000:]
    assert "Traceback" not in res.stdout + res.stderr
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_tool_output_in_a_read_only_directory_is_refused(tmp_path):
    from tests.test_run_dir_faults import tmpfs
    with tmpfs(tmp_path / "ro", ",ro") as ro:
        before = snapshot(tmp_path)
        for module, args, option in TOOL_OUTPUT_CASES:
            res = run_tool_writing_to(module, args, ro, tmp_path)
            assert res.returncode == 2, (module, res.stderr[-3000:])
            assert f"error: {option}='{ro}/" in res.stderr and f"({ro} is read-only)" in res.stderr, res.stderr[-3000:]
            assert "Traceback" not in res.stdout + res.stderr
        assert snapshot(tmp_path) == before

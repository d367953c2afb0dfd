"""The config schemas (harness/schema.py): every preset passes its own, each schema names only keys its
component takes, they are in Hydra's ConfigStore, and the check's messages are the ones computed by hand."""
from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore
from hydra.utils import get_method
from omegaconf import OmegaConf

from harness import schema
from harness.cluster import ClusterConfig
from harness.rollout import ModeConfig
from harness.wandb_logger import WandbConfig
from tests.conftest import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
GROUPS = ("cluster", "mode", "backend", "logger", "policy", "workload")
PRESETS = [(g, p.stem) for g in GROUPS for p in sorted((CONFIGS / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,name", PRESETS, ids=[f"{g}={n}" for g, n in PRESETS])
def test_every_preset_passes_its_schema(group, name):
    cfg = load_config([f"{group}={name}"])
    keys = OmegaConf.to_container(cfg[group], resolve=True)
    assert schema.check_group(group, keys), f"configs/{group}/{name}.yaml has no schema"
    schema.check(OmegaConf.to_container(cfg, resolve=True), schema.RunSchema, "")


def test_every_experiment_passes():
    for path in sorted((CONFIGS / "experiment").glob("*.yaml")):
        cfg = load_config([f"+experiment={path.stem}"])
        for group in GROUPS:
            assert schema.check_group(group, OmegaConf.to_container(cfg[group], resolve=True)), (path, group)


def _own_keys(s: type) -> set[str]:
    return {f.name for f in fields(s) if not f.metadata.get("target")}


@pytest.mark.parametrize("target", sorted(schema.TARGET_SCHEMAS))
def test_schema_keys_are_keys_the_component_takes(target):
    params = inspect.signature(get_method(target)).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return   # a backend factory that reads its group's keys itself
    assert _own_keys(schema.TARGET_SCHEMAS[target]) <= set(params), target


def test_group_schemas_match_their_dataclasses():
    # sequence_weight is set on the cluster a planner simulates thinned (ClusterConfig.weighted), not a key
    assert _own_keys(schema.ClusterSchema) == {f.name for f in fields(ClusterConfig)} - {"sequence_weight"}
    assert _own_keys(schema.ModeSchema) == {f.name for f in fields(ModeConfig)}
    assert _own_keys(schema.WandbLoggerSchema) == {f.name for f in fields(WandbConfig)}


def test_registered_in_the_config_store():
    schema.register()
    cs = ConfigStore.instance()
    node = cs.load("schema/policy/prorsa.yaml").node
    assert set(node) == {f.name for f in fields(schema.ProrsaSchema)}
    assert node._target_ == "harness.prorsa.policy.Prorsa" and OmegaConf.is_missing(node, "horizon_s")
    listed = {n.removesuffix(".yaml") for g in GROUPS for n in cs.list(f"schema/{g}")}
    assert {"cluster", "mode", "prorsa", "fixed_pd", "agent", "mix", "trace", "sim", "wandb"} <= listed


def test_group_schemas_are_the_ones_without_a_target():
    assert schema.GROUP_SCHEMAS == {"cluster": schema.ClusterSchema, "mode": schema.ModeSchema}
    assert len(schema.TARGET_SCHEMAS) == 16   # with workloads.requests (the serving benchmark)


@pytest.mark.parametrize("value,where,message", [
    ({"median": 10, "sigma": 0.1}, "", None),
    ({"median": 0, "sigma": 0.1}, "w", "w.median=0 is invalid; allowed: a number > 0"),
    ({"median": 1, "sigma": True}, "w", "w.sigma=True is invalid; allowed: a number >= 0"),
    ({"median": 1, "sigma": float("nan")}, "w", "w.sigma=nan is invalid; allowed: a number >= 0"),
    ({"median": 1}, "w", "w.sigma=None is invalid; allowed: a value (the key is required)"),
    ({"median": 1, "sigma": 0, "mu": 3}, "w", "w.mu=3 is invalid; allowed: one of high, median, sigma"),
    ("x", "w", "w='x' is invalid; allowed: a mapping with keys median, sigma, high"),
])
def test_check_known_answers(value, where, message):
    if message is None:
        schema.check(value, schema.LogNormalSchema, where)
        return
    with pytest.raises(ValueError) as e:
        schema.check(value, schema.LogNormalSchema, where)
    assert str(e.value) == message


def test_nested_lists_name_the_index():
    agent = OmegaConf.to_container(load_config(["workload=tooluse"]).workload, resolve=True)
    agent["tool_latency"][1]["sigma"] = "wide"
    with pytest.raises(ValueError) as e:
        schema.check_group("workload", agent)
    assert str(e.value) == "workload.tool_latency[1].sigma='wide' is invalid; allowed: a number >= 0"


def test_descriptions():
    d = schema._describe
    assert d(int, {"ge": 1}) == "an integer >= 1"
    assert d(float, {"gt": 0}) == "a number > 0"
    assert d(float, {"gt": 0, "le": 1}) == "(0, 1]"
    assert d(float, {"ge": 0, "le": 1}) == "[0, 1]"
    assert d(float, {"gt": -1}) == "a number > -1"
    assert d(float, {"ge": 0.5}) == "a number >= 0.5"
    assert d(bool, {}) == "true, false"
    assert d(str, {"choices": ("a", "b")}) == "a, b"
    assert d(list[str], {}) == "a list of strings"


def test_an_unknown_target_has_no_schema():
    assert schema.schema_for("policy", {"_target_": "my_lab.MyPolicy"}) is None
    assert not schema.check_group("policy", {"_target_": "my_lab.MyPolicy", "x": 1})


@pytest.mark.parametrize("key,suggested", [("sigam", "w.sigma"), ("Median", "w.median"), ("hihg", "w.high"),
                                           ("mu", None), ("tool_latency", None)])
def test_a_misspelt_key_names_the_key_it_likely_meant(key, suggested):
    with pytest.raises(ValueError) as e:
        schema.check({"median": 1, "sigma": 0, key: 3}, schema.LogNormalSchema, "w")
    hint = f"w.{key}=3 is invalid; did you mean {suggested}? allowed: one of high, median, sigma"
    assert str(e.value) == (hint if suggested else f"w.{key}=3 is invalid; allowed: one of high, median, sigma")


def test_a_misspelt_key_in_a_nested_node_is_named_with_its_path():
    cluster = OmegaConf.to_container(load_config([]).cluster, resolve=True)
    cluster["parallelism"]["prefill"]["tpp"] = 2
    with pytest.raises(ValueError) as e:
        schema.check_group("cluster", cluster)
    assert str(e.value).startswith("cluster.parallelism.prefill.tpp=2 is invalid; did you mean "
                                   "cluster.parallelism.prefill.tp? allowed: one of dp, ep, tp")

"""Bad input stops the run before anything is simulated, naming the key and the allowed values."""
import pytest
from hydra.errors import ConfigCompositionException

from harness.experiment import error_message, run_experiment
from tests.conftest import SMALL, load_config


@pytest.mark.parametrize("overrides, message", [
    (["policy=fixed_pd", "policy.num_prefill=-1"], "policy.num_prefill=-1 is invalid; allowed: an integer in [1, 7]"),
    (["policy=fixed_pd", "policy.num_prefill=8"], "policy.num_prefill=8 is invalid; allowed: an integer in [1, 7]"),
    (["cluster.gpu=h900"], "cluster.gpu='h900' is not in configs/catalogue/gpus.yaml; allowed: a100, cpu_core, h100, h20, h200, h800"),
    (["cluster.model=qwen9"], "cluster.model='qwen9' is not in configs/catalogue/models.yaml; allowed:"),
    (["cluster.num_engines=0"], "cluster.num_engines=0 is invalid; allowed: an integer >= 1"),
    (["cluster.parallelism.prefill.tp=3"], "cluster.parallelism.prefill"),
    (["cluster.parallelism.decode.ep=true"], "cluster.parallelism.decode.ep=True is invalid; allowed: false for the dense model"),
    (["cluster.memory_fraction=1.5"], "cluster.memory_fraction=1.5 is invalid; allowed: (0, 1]"),
    (["workload.batch_size=0"], "workload.batch_size=0 is invalid"),
    (["mode.num_steps=0"], "mode.num_steps=0 is invalid"),
    (["cluster.gpu=a100", "cluster.memory_fraction=0.2"], "leave no KV memory"),
])
def test_bad_value_names_key_and_allowed_values(tmp_path, overrides, message):
    cfg = load_config(SMALL + overrides)
    with pytest.raises(Exception) as err:
        run_experiment(cfg, tmp_path)
    assert message in error_message(err.value)
    assert not list(tmp_path.iterdir()), "nothing may be written for a rejected config"


def test_unknown_key_is_rejected_by_hydra():
    with pytest.raises(ConfigCompositionException, match="cluster.gpus_per_node"):
        load_config(["cluster.gpus_per_node=8"])


def test_unknown_group_option_lists_the_choices():
    with pytest.raises(ConfigCompositionException, match="Available options"):
        load_config(["policy=nonexistent"])

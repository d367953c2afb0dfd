"""Entry point: `python run.py` runs the default experiment; `python run.py -m policy=a,b` sweeps."""
import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness.experiment import run_experiment
from harness.report import print_summary


@hydra.main(config_path="configs", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    summary = run_experiment(cfg, HydraConfig.get().runtime.output_dir)
    print_summary(summary)


if __name__ == "__main__":
    main()

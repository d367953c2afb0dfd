"""Experiment loggers: `logger=wandb` (offline by default, files under the run directory) or `logger=none`.

Why a logger and not only files: W&B groups the runs of a sweep so they can be compared in its UI;
the result files stay the source of truth (report.py reads only them). The W&B logger never needs the
network unless `logger.mode=online` is asked for (with WANDB_API_KEY in the environment).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from harness.timeseries import Sample

RESULT_FILES = ("lifecycle.parquet", "engines.parquet", "timeseries.parquet")
MODES = ("offline", "online", "disabled")


class RunLogger(Protocol):
    def log_sample(self, sample: Sample) -> None: ...

    def log_results(self, out_dir: Path, summary: dict) -> None: ...

    def finish(self, failed: bool) -> None: ...


class NoLogger:
    def log_sample(self, sample: Sample) -> None:
        pass

    def log_results(self, out_dir: Path, summary: dict) -> None:
        pass

    def finish(self, failed: bool) -> None:
        pass


@dataclass(frozen=True)
class WandbConfig:
    name: str
    mode: str = "offline"
    project: str = "prorsa-harness"
    entity: str | None = None
    group: str | None = None        # None: the sweep directory's name in a multirun, no group otherwise
    tags: list[str] = field(default_factory=list)
    tables: bool = True             # lifecycle and engine timeline as wandb.Table
    max_table_rows: int = 20000     # a larger table is left to the parquet artifact (~0.5 s per 1,000 rows)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"logger.mode={self.mode!r} is invalid; allowed: {', '.join(MODES)}")


class WandbLogger:
    """One W&B run per harness run, its files in `<out_dir>/wandb/`."""

    def __init__(self, cfg: WandbConfig, config: dict, out_dir: Path, run_name: str, group: str | None):
        import wandb  # imported here: `logger=none` runs never pay for it

        self.wandb = wandb
        self.cfg = cfg
        os.environ.setdefault("WANDB_SILENT", "true")
        # Artifact staging and cache would otherwise go under the home directory.
        os.environ["WANDB_DATA_DIR"] = str(out_dir / "wandb" / "data")
        os.environ["WANDB_CACHE_DIR"] = str(out_dir / "wandb" / "cache")
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, x_disable_machine_info=True,
                                  disable_git=True, disable_code=True, save_code=False, disable_job_creation=True)
        self.run = wandb.init(project=cfg.project, entity=cfg.entity, group=cfg.group or group, name=run_name,
                              tags=list(cfg.tags), config=config, dir=str(out_dir), mode=cfg.mode,
                              settings=settings, reinit="finish_previous")
        self.run.define_metric("ts/t_s")
        self.run.define_metric("ts/*", step_metric="ts/t_s")

    def log_sample(self, sample: Sample) -> None:
        self.run.log({f"ts/{k}": v for k, v in sample.__dict__.items()})

    def log_results(self, out_dir: Path, summary: dict) -> None:
        import pandas as pd

        self.run.summary.update(summary)
        if self.cfg.tables:
            for name in ("lifecycle", "engines", "forecast"):
                if not (out_dir / f"{name}.parquet").exists():
                    continue   # forecast.parquet: only policies that forecast write it
                df = pd.read_parquet(out_dir / f"{name}.parquet")
                if len(df) > self.cfg.max_table_rows:
                    print(f"W&B: {name} has {len(df)} rows > logger.max_table_rows={self.cfg.max_table_rows}; "
                          f"not logged as a table (it is in the results artifact)")
                    continue
                # Plain Python rows and no per-column type check: 4x faster than Table(dataframe=df).
                rows = df.astype(object).where(df.notna(), None).to_numpy().tolist()
                self.run.log({f"{name}_table": self.wandb.Table(columns=list(df.columns), data=rows,
                                                                allow_mixed_types=True)})
        artifact = self.wandb.Artifact(f"results-{self.run.id}", type="results")
        for name in RESULT_FILES + ("forecast.parquet",):
            if (out_dir / name).exists():
                # immutable: the files are final, so W&B references them instead of copying them.
                artifact.add_file(str(out_dir / name), policy="immutable")
        self.run.log_artifact(artifact)

    def finish(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def make_logger(logger_cfg: dict, config: dict, out_dir: Path, run_name: str, group: str | None) -> RunLogger:
    name = logger_cfg.get("name")
    if name == "none":
        return NoLogger()
    if name == "wandb":
        return WandbLogger(WandbConfig(**logger_cfg), config, out_dir, run_name, group)
    raise ValueError(f"logger.name={name!r} is invalid; allowed: none, wandb")

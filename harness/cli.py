"""One command-line style for the tools: argparse options (`--out DIR`) for what the tool itself takes,
and `KEY=VALUE` arguments for Hydra overrides of configs/config.yaml, as `python run.py` takes them.
Bad input ends in argparse's usage and one line naming the key, exit status 2, no traceback.

run.py is the Hydra application itself; `run_help` lists the groups a user picks there for its `--help`.
"""
from __future__ import annotations

import argparse
import difflib
import itertools
import logging
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, InstantiationException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.schema import did_you_mean

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# Bad input as the tools meet it: a value (ValueError, naming the key), an override Hydra cannot apply
# (its own message names it), a file that cannot be read (the OSError names it).
BAD_INPUT = (ValueError, HydraException, OmegaConfBaseException, OSError)


def prog(module: str) -> str:
    """The name the user typed: the console script (`prorsa-report`) or `python -m harness.report`."""
    name = Path(sys.argv[0]).name
    return name if name.startswith("prorsa-") else f"python -m {module}"


def parser(module: str, description: str, overrides: bool = True) -> argparse.ArgumentParser:
    """A tool's parser; with `overrides`, its positional arguments are Hydra overrides (KEY=VALUE)."""
    p = argparse.ArgumentParser(prog=prog(module), description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if overrides:
        p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="Hydra overrides of configs/config.yaml, as python run.py takes them "
                            "(workload=swe, cluster.num_engines=4, +experiment=NAME)")
    return p


def tool_error(exc: BaseException) -> str:
    """One line for a bad input: the cause Hydra wrapped while instantiating a `_target_`, else Hydra's
    first line (the rest is its search path)."""
    if isinstance(exc, InstantiationException) and exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0] if isinstance(exc, HydraException) else text.replace("\n", " ")


def run_tool(p: argparse.ArgumentParser, main: Callable[[argparse.Namespace], None], argv: list[str] | None,
             catch: tuple[type[BaseException], ...] = BAD_INPUT) -> None:
    """Parses `argv` (options and overrides in any order) and runs `main(args)`; bad input (`catch`)
    becomes argparse's error: usage, one line, exit status 2."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")   # libraries' chatter (fontTools) left out
    logging.getLogger("harness").setLevel(logging.INFO)
    args = p.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    options = {a.dest: a.option_strings[-1] for a in p._actions if a.option_strings}
    for override in getattr(args, "overrides", []):
        key, eq, value = override.partition("=")
        if not eq and not key.startswith("~"):
            p.error(f"{override!r} is not an override; allowed: KEY=VALUE (or an option: --help lists them)")
        if key.replace("-", "_") in options:   # the tool's own key, as the older key=value style gave it
            p.error(f"{override!r} is an option of this tool: {options[key.replace('-', '_')]} {value}")
    try:
        check_overrides(getattr(args, "overrides", []))
        main(args)
    except catch as exc:
        p.error(tool_error(exc))


# --- run.py's --help --------------------------------------------------------------------------------
# The groups a user picks (configs/<group>/*.yaml). Not listed: catalogue/ (GPU and model data the
# cluster reads) and schema/* (harness/schema.py's dataclasses in Hydra's ConfigStore), never picked.
RUN_GROUPS = ("policy", "workload", "cluster", "mode", "backend", "logger")


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def run_help(choices) -> str:
    """The group lines of run.py's `--help` (configs/hydra/help/harness.yaml): each group's options, the
    one this command line picks marked, then the experiments, which need `+experiment=`."""
    width = len("  +experiment  ")

    def listed(head: str, group: str) -> str:
        names = ", ".join(f"[{o}]" if o == choices.get(group) else o for o in _options(group))
        return textwrap.fill(names, 100, initial_indent=head.ljust(width), subsequent_indent=" " * width)

    return "\n".join([*(listed(f"  {g}", g) for g in RUN_GROUPS), "",
                      "Experiments: presets over several groups (configs/experiment/); the default picks none,",
                      "so one is added with a '+': +experiment=NAME.", listed("  +experiment", "experiment")])


def check_overrides(overrides: list[str]) -> None:
    """Raises ValueError, one line with the closest allowed name, for an override naming a group option, a
    top-level key or a key inside a group that does not exist (`workload=swee`, `polcy=prorsa`,
    `cluster.num_engine=8`), or an experiment without its '+'. Checked before Hydra composes: Hydra's own
    message is several lines and guesses nothing. The values are the schemas' to check (harness/schema.py),
    in the run; `hydra...`, added (`+key`, `++key`) and removed (`~key`) keys are left to Hydra (an added
    key's name is checked by its group's schema)."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return   # a syntax error: Hydra's message shows where
    top = [k for k in OmegaConf.load(CONFIGS / "config.yaml") if k not in ("defaults", "hydra")]
    groups = [*RUN_GROUPS, "experiment"]
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra") or o.is_delete():
            continue
        if key in groups:
            if key == "experiment" and not o.is_add():
                raise ValueError(f"{o.input_line} is invalid; an experiment is added: +{o.input_line}")
            if o.value_type == o.value_type.GLOB_CHOICE_SWEEP:
                continue   # glob(...) picks among the options itself
            names = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            options, shown = _options(key), ("+" if o.is_add() else "") + key
            for name in names:
                if name not in options:
                    raise ValueError(f"{shown}={name} is invalid;{did_you_mean(name, options, shown + '=')} "
                                     f"allowed: one of {', '.join(options)}")
        elif key.split(".")[0] not in [*top, *groups] and not (o.is_add() or o.is_force_add()):
            head = key.split(".")[0]
            raise ValueError(f"{o.input_line} is invalid: no group or key {head!r};"
                             f"{did_you_mean(head, [*groups, *top])} allowed: one of {', '.join([*groups, *top])}")
    _check_keys(parsed, groups)


def _check_keys(parsed: list[Override], groups: list[str]) -> None:
    """The keys a command line sets inside a group (`cluster.num_engine=8`, `cluster.parallelism.prefil.tp=2`)
    against the config they would change: composed with Hydra's compose API from the command line's group
    choices (an experiment's among them) and added or removed keys, as Hydra will compose it. In a sweep,
    every combination of the swept groups' options is composed: Hydra refuses the whole sweep when a key is
    missing from one job's config. A config Hydra cannot compose is left to Hydra's own message."""
    checked = [o for o in parsed if "." in o.key_or_group and not o.key_or_group.startswith("hydra")
               and not (o.is_add() or o.is_force_add() or o.is_delete())]
    if not checked:
        return   # no key inside a group: nothing to compose
    slots = []   # per override that shapes the config, its alternatives (several: a swept group)
    for o in parsed:
        if o in checked or o.key_or_group.startswith("hydra"):
            continue
        if o.key_or_group in groups and o.is_sweep_override():
            names = (o.value().filter(_options(o.key_or_group)) if o.value_type == o.value_type.GLOB_CHOICE_SWEEP
                     else list(o.sweep_string_iterator()))
            slots.append([f"{o.get_key_element()}={name}" for name in names])
        elif not o.is_sweep_override():
            slots.append([o.input_line])
    configs = []
    try:
        with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
            for combo in itertools.product(*slots):
                try:
                    configs.append((combo, compose("config", overrides=list(combo), return_hydra_config=True)))
                except (HydraException, OmegaConfBaseException, ValueError):
                    pass   # Hydra says why when it composes
    except ValueError:
        return   # called inside another Hydra initialisation: left to Hydra
    for combo, cfg in configs:
        for o in checked:
            missing = _missing_key(cfg, o.key_or_group)
            if missing is None:
                continue
            parent, name, keys = missing
            group = o.key_or_group.split(".")[0]
            chosen = cfg.hydra.runtime.choices.get(group) if group in RUN_GROUPS else None
            where = f"{parent} ({group}={chosen})" if chosen else parent or "the config"
            swept = [c for c, slot in zip(combo, slots) if len(slot) > 1 and c != f"{group}={chosen}"]
            hint = did_you_mean(name, keys, f"{parent}." if parent else "")
            if not hint and chosen:
                hint = _in_other_options(group, chosen, parent.split(".")[1:], name)
            allowed = f"one of {', '.join(keys)}" if keys else "none"
            if not hint:
                allowed += f", or a key added with a '+': +{o.input_line}"
            raise ValueError(f"{o.input_line} is invalid{' with ' + ', '.join(swept) if swept else ''}: "
                             f"no key {name!r} in {where};{hint} allowed: {allowed}")


def _missing_key(cfg: DictConfig, key: str) -> tuple[str, str, list[str]] | None:
    """(the path above, the name, the keys there) for the first part of a dotted key missing from `cfg`,
    where Hydra would refuse it (a mapping in struct mode); None when every part is there, or where a list,
    a value, an interpolation or an open mapping leaves it to Hydra."""
    node, path = cfg, []
    for part in key.split("."):
        if not isinstance(node, DictConfig) or not OmegaConf.is_struct(node):
            return None
        keys = [str(k) for k in node.keys() if not (node is cfg and k == "hydra")]
        if part not in keys:
            return ".".join(path), part, keys
        if OmegaConf.is_missing(node, part) or OmegaConf.is_interpolation(node, part):
            return None
        node, path = node[part], [*path, part]
    return None


def _in_other_options(group: str, chosen: str, path: list[str], name: str) -> str:
    """' did you mean <key>, with <group>=<option>?' where another option of the group (its own YAML) has a
    key close to `name` at `path`: `mode.max_inflight` is `mode.max_in_flight` of mode=async."""
    found: dict[str, list[str]] = {}
    for option in _options(group):
        node = OmegaConf.load(CONFIGS / group / f"{option}.yaml")
        for part in path:
            node = node.get(part) if isinstance(node, DictConfig) else None
        if option != chosen and isinstance(node, DictConfig):
            for k in node.keys():
                found.setdefault(str(k), []).append(option)
    close = difflib.get_close_matches(name, [k for k in found if k != "defaults"], n=1)
    if not close:
        return ""
    options = ", ".join(f"{group}={option}" for option in found[close[0]])
    return f" did you mean {'.'.join([group, *path, close[0]])}, with {options}?"

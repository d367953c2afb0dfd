"""Trace replay (`workload=trace workload.path=FILE`) and export, in one JSONL format.

One trajectory per line:
    {"group": 7, "family": "swe",
     "turns": [{"new_tokens": 1480, "output_tokens": 212, "tool_latency_s": 0.4, "tool_output_tokens": 365},
               {"new_tokens": 365, "output_tokens": 97, "tool_latency_s": 0.0, "tool_output_tokens": 0}]}
- `group` (integer or string): the prompt the trajectory samples; lines of one group form a GRPO group.
- `family` (string): the task family, kept on every turn record.
- `turns` (non-empty list), each with all four fields: `new_tokens` (integer; the prompt on turn 0,
  >= 1; after that the tokens appended before the turn, which must equal the previous turn's
  `tool_output_tokens`), `output_tokens` (integer >= 1), `tool_latency_s` (number >= 0) and
  `tool_output_tokens` (integer >= 0) of the tool call after the turn (the last turn's are ignored).
- `max_output_tokens` (integer >= 1, optional): the per-turn cap a request carries.
No other keys are accepted, so a misspelt field is an error rather than a silent default; nor a key
twice in one object (JSON would keep the last one silently). The file is UTF-8; token counts are at most
MAX_TOKENS and latencies at most a day (larger ones are mistakes, and the periodic ticks of a run would
go on for ever), numbers are finite, and nesting deeper than the format's is refused.

Steps and batches: groups are taken in order of first appearance; all must have the same size (the
group size). RL step s replays groups s*B .. s*B + B - 1 (B = `batch_size`, by default every group
in the file, so one file is one step), wrapping around to the start when the file runs out. Ids are
renumbered as generators number them (step * B*G + index), so replayed ids are unique across steps
and a trace exported from a generator replays with the same ids.

The whole file is read and checked when the workload is built: a malformed line is rejected with the
file name, line number and field, before anything is simulated.

`priors()` are distribution priors from the trace, not a replay of it: per family, a lognormal fitted
to the file's own values (median, and standard deviation of the logs; workloads.base.fit_lognormal,
which keeps a mixture's components where the values are clearly multimodal) of first prompts, outputs
per turn, tool output and latency per tool call, and turns per trajectory; and the recorded
trajectories' shapes in their groups (`FamilyPriors.examples`: sizes and latencies, no ids, no order).
A policy learns what the file's population looks like, never which trajectory runs when.
`prior_path`: another trace to learn the priors from (the same agents on other prompts), so that a
policy is judged on trajectories it has never seen; by default the replayed file itself.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from harness.api import ExampleTrajectory, FamilyPriors
from harness.stats import intraclass_correlation, size_level_correlation
from harness.trajectory import TrajectoryScript, TurnScript
from workloads.base import Workload, fit_lognormal, group_id, trajectory_id

LINE_KEYS = {"group", "family", "turns", "max_output_tokens"}
TURN_KEYS = {"new_tokens", "output_tokens", "tool_latency_s", "tool_output_tokens"}
DEFAULT_MAX_OUTPUT_TOKENS = 32768
MAX_TOKENS = 10_000_000          # tokens of one turn: beyond any model's context
MAX_LATENCY_S = 86400.0          # one tool call: a day
MAX_DEPTH = 16                   # nesting of a line: the format has 3 levels


class TraceError(ValueError):
    """A malformed trace line; the message names the file, the line and the field."""


def expect_int(value, where: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"{where}: expected an integer >= {low}, got {shown(value)}")
    if not low <= value <= MAX_TOKENS:
        raise TraceError(f"{where}: expected an integer >= {low} and <= {MAX_TOKENS}, got {shown(value)}")
    return value


def expect_seconds(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(f"{where}: expected a number >= 0, got {shown(value)}")
    if not (0 <= value <= MAX_LATENCY_S and math.isfinite(value)):
        raise TraceError(f"{where}: expected a finite number >= 0 and <= {MAX_LATENCY_S:.0f} (a day), "
                         f"got {shown(value)}")
    return float(value)


def shown(value) -> str:
    """A value for a message: a 400-digit integer as its length, not its digits."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10 ** 30 else f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= 80 else text[:77] + "..."


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json's object hook: a key twice in one object is refused (json would keep the last silently)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise TraceError(f"field {key!r}: appears twice in one object")
        out[key] = value
    return out


def depth(obj, limit: int) -> int:
    """The nesting depth of a decoded line, counted without recursion up to `limit` + 1."""
    level, frontier = 0, [obj]
    while frontier and level <= limit:
        level += 1
        frontier = [v for o in frontier if isinstance(o, (dict, list)) for v in (o.values() if isinstance(o, dict) else o)]
    return level


def parse_line(obj, where: str) -> tuple[int | str, TrajectoryScript]:
    """One trace line (already JSON-decoded) to (group key, script with ids 0); `where` is 'file:line'."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = set(obj) - LINE_KEYS
    if unknown:
        raise TraceError(f"{where}: field {sorted(unknown)[0]!r}: unknown; allowed: {sorted(LINE_KEYS)}")
    for key in ("group", "family", "turns"):
        if key not in obj:
            raise TraceError(f"{where}: field {key!r}: missing")
    group = obj["group"]
    if isinstance(group, bool) or not isinstance(group, (int, str)):
        raise TraceError(f"{where}: field 'group': expected an integer or a string, got {group!r}")
    if not isinstance(obj["family"], str):
        raise TraceError(f"{where}: field 'family': expected a string, got {obj['family']!r}")
    turns = obj["turns"]
    if not isinstance(turns, list) or not turns:
        raise TraceError(f"{where}: field 'turns': expected a non-empty list, got {turns!r}")
    max_out = expect_int(obj.get("max_output_tokens", DEFAULT_MAX_OUTPUT_TOKENS),
                         f"{where}: field 'max_output_tokens'", 1)
    scripted, previous_tool_output = [], 0
    for k, turn in enumerate(turns):
        at = f"{where}: field 'turns[{k}]"
        if not isinstance(turn, dict):
            raise TraceError(f"{at}': expected an object, got {turn!r}")
        missing, unknown = sorted(TURN_KEYS - set(turn)), sorted(set(turn) - TURN_KEYS)
        if missing:
            raise TraceError(f"{at}.{missing[0]}': missing")
        if unknown:
            raise TraceError(f"{at}.{unknown[0]}': unknown; allowed: {sorted(TURN_KEYS)}")
        new = expect_int(turn["new_tokens"], f"{at}.new_tokens'", 1 if k == 0 else 0)
        if k > 0 and new != previous_tool_output:
            raise TraceError(f"{at}.new_tokens': {new} differs from turns[{k - 1}].tool_output_tokens="
                             f"{previous_tool_output} (the tokens appended are the previous tool's output)")
        output = expect_int(turn["output_tokens"], f"{at}.output_tokens'", 1)
        latency = expect_seconds(turn["tool_latency_s"], f"{at}.tool_latency_s'")
        previous_tool_output = expect_int(turn["tool_output_tokens"], f"{at}.tool_output_tokens'", 0)
        last = k == len(turns) - 1
        scripted.append(TurnScript(new_tokens=new, output_tokens=output, tool_latency_s=0.0 if last else latency))
    script = TrajectoryScript(trajectory_id=0, group_id=0, family=obj["family"], turns=tuple(scripted),
                              max_output_tokens=max_out)
    return group, script


def json_lines(path: Path) -> Iterator[tuple[str, object]]:
    """(`file:line`, parsed object) for every non-blank line; a line that is not UTF-8 JSON, has a key
    twice in an object or nests too deeply is a TraceError naming the file and line."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TraceError(f"{where}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1})") from None
            if not text.strip():
                continue
            try:
                obj = json.loads(text, object_pairs_hook=unique_keys)
            except TraceError as e:
                raise TraceError(f"{where}: {e}") from None
            except json.JSONDecodeError as e:
                raise TraceError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            except ValueError as e:   # an integer beyond Python's digit limit
                raise TraceError(f"{where}: not valid JSON ({e})") from None
            except RecursionError:
                raise TraceError(f"{where}: nested too deeply (more than {MAX_DEPTH} levels)") from None
            if depth(obj, MAX_DEPTH) > MAX_DEPTH:
                raise TraceError(f"{where}: nested too deeply (more than {MAX_DEPTH} levels)")
            yield where, obj


def read_trace(path: str | Path) -> list[list[TrajectoryScript]]:
    """Every group of the file, in order of first appearance; raises TraceError on the first bad line."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file (looked for {path.resolve()}; a relative path is "
                         "taken from the directory run.py is started in)")
    groups: dict[int | str, list[TrajectoryScript]] = {}
    first_line: dict[int | str, str] = {}
    for where, obj in json_lines(path):
        key, script = parse_line(obj, where)
        groups.setdefault(key, []).append(script)
        first_line.setdefault(key, where)
    if not groups:
        raise TraceError(f"{path}: no trajectories")
    sizes = {k: len(v) for k, v in groups.items()}
    size = next(iter(sizes.values()))
    for key, n in sizes.items():
        if n != size:
            raise TraceError(f"{first_line[key]}: field 'group': group {key!r} has {n} trajectories, "
                             f"the first group has {size}; every group must have the same size")
    return list(groups.values())


@dataclass
class TraceWorkload:
    path: str
    name: str = "trace"
    seed: int = 0                   # accepted like any workload's; a replay draws nothing
    batch_size: int | None = None   # groups per RL step; None: every group in the file
    prior_path: str | None = None   # the trace the priors are learned from; None: `path`
    group_size: int = field(init=False)
    groups: list[list[TrajectoryScript]] = field(init=False, repr=False)
    prior_groups: list[list[TrajectoryScript]] = field(init=False, repr=False)

    def __post_init__(self):
        if self.prior_path is not None and Path(self.prior_path).resolve() == Path(self.path).resolve():
            raise ValueError(f"workload.prior_path={self.prior_path!r} is invalid; allowed: another trace than "
                             f"workload.path, or null (the priors are then learned from workload.path)")
        self.groups = read_trace(self.path)
        self.prior_groups = self.groups if self.prior_path is None else read_trace(self.prior_path)
        self.group_size = len(self.groups[0])
        if self.batch_size is None:
            self.batch_size = len(self.groups)
        if self.prior_path is not None:
            missing = {s.family for g in self.groups for s in g} - {s.family for g in self.prior_groups for s in g}
            if missing:
                raise TraceError(f"{self.prior_path}: workload.prior_path has no trajectory of the replayed "
                                 f"families {sorted(missing)}")

    def priors(self) -> dict[str, FamilyPriors]:
        by_family: dict[str, list[TrajectoryScript]] = {}
        for script in (s for group in self.prior_groups for s in group):
            by_family.setdefault(script.family, []).append(script)
        out = {}
        for family, scripts in by_family.items():
            calls = [(s, k) for s in scripts for k in range(len(s.turns) - 1)]   # the last turn calls no tool
            out[family] = FamilyPriors(
                prompt_tokens=fit_lognormal(s.turns[0].new_tokens for s in scripts),
                output_tokens=fit_lognormal(t.output_tokens for s in scripts for t in s.turns),
                tool_output_tokens=fit_lognormal(s.tool_output_tokens(k) for s, k in calls),
                tool_latency_s=fit_lognormal(s.turns[k].tool_latency_s for s, k in calls),
                turns=fit_lognormal(len(s.turns) for s in scripts),
                max_turns=max(len(s.turns) for s in scripts),
                context_cap=max(sum(t.new_tokens + t.output_tokens for t in s.turns) for s in scripts),
                output_shared=intraclass_correlation(logs(s) for s in scripts) or 0.0,
                turns_output_corr=size_level_correlation(logs(s) for s in scripts) or 0.0,
                turns_group_corr=intraclass_correlation(
                    [np.log(len(s.turns)) for s in group if s.family == family] for group in self.prior_groups) or 0.0,
                examples=tuple(members for group in self.prior_groups
                               if (members := tuple(example(s) for s in group if s.family == family))))
        return out

    def batch(self, step: int) -> list[TrajectoryScript]:
        out = []
        for g in range(self.batch_size):
            members = self.groups[(step * self.batch_size + g) % len(self.groups)]
            for i, script in enumerate(members):
                out.append(replace(script, step=step, group_id=group_id(step, self.batch_size, g),
                                   trajectory_id=trajectory_id(step, self.batch_size, self.group_size,
                                                               g * self.group_size + i)))
        return out


def example(script: TrajectoryScript) -> ExampleTrajectory:
    """A trajectory's shape, without its ids."""
    calls = range(len(script.turns) - 1)   # the last turn calls no tool
    return ExampleTrajectory(script.turns[0].new_tokens, tuple(t.output_tokens for t in script.turns),
                             tuple(script.tool_output_tokens(k) for k in calls),
                             tuple(script.turns[k].tool_latency_s for k in calls))


def logs(script: TrajectoryScript) -> np.ndarray:
    """A trajectory's log output tokens, turn by turn."""
    return np.log([max(t.output_tokens, 1) for t in script.turns])


def trace_line(script: TrajectoryScript) -> dict:
    """A script as one line of the trace format."""
    turns = []
    for k, t in enumerate(script.turns):
        turns.append({"new_tokens": t.new_tokens, "output_tokens": t.output_tokens,
                      "tool_latency_s": t.tool_latency_s, "tool_output_tokens": script.tool_output_tokens(k)})
    return {"group": script.group_id, "family": script.family, "turns": turns,
            "max_output_tokens": script.max_output_tokens}


def write_trace(path: str | Path, scripts: Iterable[TrajectoryScript]) -> int:
    """Write scripts as a JSONL trace (in the order given, a group's lines together); returns the count."""
    n = 0
    with Path(path).open("w") as f:
        for script in scripts:
            f.write(json.dumps(trace_line(script)) + "\n")
            n += 1
    return n


def export_trace(workload: Workload, num_steps: int, path: str | Path) -> int:
    """Any generator's first `num_steps` batches as a trace that replays them with batch_size=B."""
    return write_trace(path, (s for step in range(num_steps) for s in workload.batch(step)))

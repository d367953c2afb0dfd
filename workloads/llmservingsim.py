"""Import LLMServingSim agentic sessions into the trace format of workloads/trace.py.

LLMServingSim (its agentic-session dataset) writes one session per JSONL line:
    {"session_id": ..., "arrival_time_ns": ..., "sub_requests": [
        {"input_toks": 1200, "output_toks": 80, "tool_duration_ns": 2.1e9}, ...]}
`input_toks` is a sub-request's whole prompt, which grows by the previous output and what the tool
appended, so turn k's new tokens are input_k - input_{k-1} - output_{k-1}. A session whose prompt
shrinks (a compacted history) cannot be replayed by append-only scripts and is rejected, as is any
malformed line (file, line and field named). Other keys of a session or sub-request are ignored.

Sessions have no GRPO group: consecutive runs of `group_size` sessions form one group (default 1),
and arrival times are dropped (in RL the driver releases a step's trajectories itself).

    python -m workloads.llmservingsim SESSIONS.jsonl TRACE.jsonl [--family NAME] [--group-size G]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from workloads.trace import TraceError, expect_int, json_lines, parse_line

NS = 1e-9


def session_to_line(obj, where: str, group: int, family: str) -> dict:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    subs = obj.get("sub_requests")
    if not isinstance(subs, list) or not subs:
        raise TraceError(f"{where}: field 'sub_requests': expected a non-empty list, got {subs!r}")
    turns, context = [], 0
    for k, sub in enumerate(subs):
        at = f"{where}: field 'sub_requests[{k}]"
        if not isinstance(sub, dict):
            raise TraceError(f"{at}': expected an object, got {sub!r}")
        for key in ("input_toks", "output_toks"):
            if key not in sub:
                raise TraceError(f"{at}.{key}': missing")
        prompt = expect_int(sub["input_toks"], f"{at}.input_toks'", 1)
        output = expect_int(sub["output_toks"], f"{at}.output_toks'", 1)
        duration = sub.get("tool_duration_ns", 0)
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not duration >= 0:
            raise TraceError(f"{at}.tool_duration_ns': expected a number >= 0, got {duration!r}")
        new = prompt - context
        if new < 0:
            raise TraceError(f"{at}.input_toks': {prompt} is below the previous prompt + output ({context}); "
                             "a shrinking context cannot be replayed")
        if turns:
            turns[-1]["tool_output_tokens"] = new
        turns.append({"new_tokens": new, "output_tokens": output, "tool_latency_s": float(duration) * NS,
                      "tool_output_tokens": 0})
        context = prompt + output
    line = {"group": group, "family": family, "turns": turns}
    parse_line(line, where)  # the converted line must be a valid trace line
    return line


def import_sessions(src: str | Path, dst: str | Path, family: str = "llmservingsim", group_size: int = 1) -> int:
    """Convert a whole session file (checked completely before `dst` is written); returns the count."""
    if group_size < 1:
        raise ValueError(f"group_size={group_size} is invalid; allowed: an integer >= 1")
    src = Path(src)
    lines = []
    for where, obj in json_lines(src):
        lines.append(session_to_line(obj, where, len(lines) // group_size, family))
    if len(lines) % group_size:
        raise TraceError(f"{src}: {len(lines)} sessions do not split into groups of {group_size}")
    Path(dst).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return len(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="LLMServingSim agentic sessions -> trajectory trace (JSONL)")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--family", default="llmservingsim")
    p.add_argument("--group-size", type=int, default=1)
    a = p.parse_args(argv)
    n = import_sessions(a.src, a.dst, a.family, a.group_size)
    print(f"wrote {n} trajectories to {a.dst}")


if __name__ == "__main__":
    main()

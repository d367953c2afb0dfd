"""The critical path's shares and the gain the lower bound leaves, on a hand-made lifecycle."""
import math
from dataclasses import astuple

import pandas as pd
import pytest

from harness.critical_path import PathShares, critical_path_shares, max_gain, why_text

COLUMNS = ["trajectory_id", "step", "turn", "t_ready", "t_prefill_start", "t_prefill_end", "t_transfer_end",
           "t_decode_start", "t_decode_end", "t_tool_end"]
# Step 0: trajectory 0 (two turns, ends at 22 s) and 1 (ends at 5 s); step 1 from 22 s: trajectory 2 (ends at
# 30 s) and 3 (ends at 26 s). Seconds per part:       tool  queue  prefill  transfer  decode
LIFECYCLE = pd.DataFrame([
    [0, 0, 0, 0.0, 1.0, 3.0, 4.0, 5.0, 9.0, 19.0],      # 10     1+1     2        1         4
    [0, 0, 1, 19.0, 19.0, 20.0, 20.0, 20.0, 22.0, 22.0],  # 0      0       1        0         2
    [1, 0, 0, 0.0, 0.0, 1.0, 1.0, 1.0, 5.0, 5.0],       # 0      0       1        0         4
    [2, 1, 0, 22.0, 24.0, 25.0, 25.0, 25.0, 30.0, 30.0],  # 0      2       1        0         5
    [3, 1, 0, 22.0, 22.0, 23.0, 23.0, 23.0, 26.0, 26.0],  # 0      0       1        0         3
], columns=COLUMNS)


def test_sync_takes_each_steps_last_trajectory():
    """Trajectories 0 and 2: 22 + 8 = 30 s, of which 10 s tool, 4 queue, 4 prefill, 1 transfer, 11 decode."""
    shares = critical_path_shares(LIFECYCLE, "sync")
    assert astuple(shares) == pytest.approx((10 / 30, 4 / 30, 4 / 30, 1 / 30, 11 / 30))   # tool, queue, ... decode
    assert math.fsum(astuple(shares)) == pytest.approx(1.0)
    assert shares.largest == "decode"


def test_async_takes_the_mean_trajectory():
    """All four: 39 s, of which 10 s tool, 4 queue, 6 prefill, 1 transfer, 18 decode."""
    shares = critical_path_shares(LIFECYCLE, "async")
    assert astuple(shares) == pytest.approx((10 / 39, 4 / 39, 6 / 39, 1 / 39, 18 / 39))
    assert math.fsum(astuple(shares)) == pytest.approx(1.0)


def test_a_tool_bound_path_and_the_gain_its_bound_leaves():
    """A 100 s run whose critical path is 86% tool calls, against a lower bound of 95 s: 100 / 95 - 1."""
    gain = max_gain(100.0, 95.0)
    assert gain == pytest.approx(5 / 95)
    # The tool floor alone would allow 100 / 86 - 1; the lower bound holds it and is tighter.
    assert gain <= 1 / 0.86 - 1
    text = why_text(PathShares(tool=0.86, queue=0.02, prefill=0.04, transfer=0.0, decode=0.08), "colocate", 0.95, gain)
    assert text == ("tool-bound: 86% of colocate's critical path in tool calls (queue 2%, prefill 4%, transfer 0%, "
                    "decode 8%); colocate is at 0.95 of the lower bound: no allocation can beat it by more than 5.3%")

"""The workload card's figure: the report's style (print sizes, one page wide), every panel's axes
labelled, a title of at most two lines."""
from harness.figure_style import MAX_WIDTH_IN, rc
from workloads.card import build, draw, figure
from workloads.stats import METRICS


def test_card_figure_in_the_report_style_with_axis_labels(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    figure(draw(build(["workload=swe"]), 40), "swe", tmp_path / "swe.png")
    [fig] = kept
    panels = [a for a in fig.axes if a.axison]
    assert [a.get_title() for a in panels] == list(METRICS)
    assert all(a.get_xlabel() and a.get_ylabel() for a in panels)
    assert fig.get_figwidth() <= MAX_WIDTH_IN and fig.get_suptitle().count("\n") <= 1
    assert panels[0].title.get_fontsize() == rc()["axes.titlesize"]
    assert (tmp_path / "swe.png").stat().st_size > 1000

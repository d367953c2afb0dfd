"""scripts/published.py: a published row without a source is refused by name; published cells parse."""
import pandas as pd
import pytest

from scripts.published import POINTS, SOURCES, published_value, read_sources


def test_a_row_without_a_source_is_named(tmp_path):
    rows = pd.read_csv(SOURCES, dtype=str)
    rows.loc[rows["id"] == "lep_prefill_2k", "source"] = ""
    path = tmp_path / "sources.csv"
    rows.to_csv(path, index=False)
    with pytest.raises(ValueError, match="row\\(s\\) lep_prefill_2k have no source"):
        read_sources(path)


def test_every_simulated_point_is_a_published_row():
    ids = set(read_sources(SOURCES)["id"])
    assert {p.id for p in POINTS} <= ids


@pytest.mark.parametrize("cell, value", [("23,789", 23789.0), ("~100", 100.0), ("20-22", 21.0), ("3623", 3623.0)])
def test_published_cells_parse(cell, value):
    assert published_value(cell) == value


def test_a_decode_point_whose_batch_does_not_fit_is_refused_by_name():
    from scripts.published import DecodePoint, decode_point, deepseek_unit
    bf16 = [o for o in deepseek_unit("h100", 72, 256, 16384) if "weight_dtype" not in o]
    with pytest.raises(ValueError, match="too_big: 256 x 2000 KV tokens per rank exceed"):
        decode_point(DecodePoint("too_big", bf16, [256] * 72, 2000, ""))
    value, _ = decode_point(DecodePoint("fits", deepseek_unit("h100", 72, 256, 16384), [256] * 72, 2000, ""))
    assert value > 0

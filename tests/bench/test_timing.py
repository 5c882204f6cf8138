"""The benchmarks' shared figures (timing.py) on fixed numbers: the nearest-rank percentile, a
round's cell (median, the worst in brackets, the lowest where higher is better) and table lines."""

import math

import pytest
from timing import cell, p50_p99, percentile, table_header, table_row, time_ms, worst

HUNDRED = [float(v) for v in range(100, 0, -1)]  # 100 .. 1, unsorted on purpose


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.5, 51.0), (0.99, 100.0), (0.0, 1.0), (0.999, 100.0)],
    ids=["p50-upper-middle", "p99", "min", "clamped-to-last"],
)
def test_percentile_is_the_nearest_rank_of_the_sorted_samples(q: float, expected: float) -> None:
    assert percentile(HUNDRED, q) == expected


def test_percentile_of_no_samples_is_nan() -> None:
    assert math.isnan(percentile([], 0.99))


def test_p50_is_the_median_and_p99_the_nearest_rank() -> None:
    assert p50_p99([3.0, 1.0, 2.0, 10.0]) == (2.5, 10.0)


def test_cell_gives_the_median_round_and_the_worst() -> None:
    rounds = [1.25, 0.5, 2.0]
    assert cell(rounds) == "1.25 (2.00)"
    assert cell(rounds, "{:.0f}", is_higher_better=True) == "1 (0)"  # requests/s: the lowest is worst
    assert cell([0.9, 0.95], "{:.0%}", is_higher_better=True) == "92% (90%)"
    assert worst(rounds) == 2.0
    assert worst(rounds, is_higher_better=True) == 0.5


def test_table_lines_are_markdown_with_figures_right_aligned() -> None:
    assert table_header("clients", "p50 ms", "p99 ms") == "| clients | p50 ms | p99 ms |\n|---|---:|---:|"
    assert table_row(16, "0.52 (0.60)", 1.5) == "| 16 | 0.52 (0.60) | 1.5 |"


def test_time_ms_times_each_call_after_its_untimed_preparation() -> None:
    calls: list[str] = []
    samples = time_ms(lambda: calls.append("call"), 3, before=lambda: calls.append("before"))
    assert calls == ["before", "call"] * 3
    assert len(samples) == 3
    assert all(ms >= 0 for ms in samples)

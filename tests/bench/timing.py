"""Timing and tables the product benchmarks share: a call timed per iteration, the nearest-rank
percentile of exact samples, a cell of rounds (their median, the worst in brackets), markdown table
lines and the environment line a table is read with. Plain Python (torch only inside `environment`),
so that tests/bench/test_timing.py checks it on any machine."""

import datetime
import statistics
import time
from collections.abc import Callable, Sequence


def time_ms(
    call: Callable[[], object], iters: int, before: Callable[[], object] | None = None
) -> list[float]:
    """Milliseconds of each of `iters` calls of `call`; `before` (e.g. torch.cuda.synchronize, so that
    each call starts with the device idle) runs untimed ahead of each."""
    out = []
    for _ in range(iters):
        if before is not None:
            before()
        started = time.perf_counter()
        call()
        out.append((time.perf_counter() - started) * 1e3)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q < 1) of exact samples: the value at index q * n of the
    sorted samples, never interpolated; NaN for no samples."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def p50_p99(values: Sequence[float]) -> tuple[float, float]:
    return statistics.median(values), percentile(values, 0.99)


def worst(values: Sequence[float], is_higher_better: bool = False) -> float:
    return min(values) if is_higher_better else max(values)


def cell(values: Sequence[float], unit: str = "{:.2f}", is_higher_better: bool = False) -> str:
    """One figure over rounds: "median (worst)", the worst the lowest where higher is better."""
    return f"{unit.format(statistics.median(values))} ({unit.format(worst(values, is_higher_better))})"


def table_header(*columns: str) -> str:
    """A markdown table's header and separator: the first column left-aligned, the figures right."""
    return "| " + " | ".join(columns) + " |\n|" + "---|" + "---:|" * (len(columns) - 1)


def table_row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def environment(*libraries: str) -> str:
    """"<GPU or CPU>, torch <version>[, <library> <version>...], <date>": what a table was measured
    with. `libraries` are importable names whose `__version__` is reported."""
    import importlib

    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    versions = [f"{name} {importlib.import_module(name).__version__}" for name in ("torch", *libraries)]
    return ", ".join([device, *versions, datetime.date.today().isoformat()])

"""The one benchmark harness: interleaved rounds, medians and spread, tables, JSON and PNG.

A scenario registers *cases* (scenario x method), each a callable that runs one measurement and
returns a dict of metrics. ``Bench.run`` calls every case once per round, in alternating order
(A B C, C B A, ...), so that load from elsewhere on the machine hits every method alike; the
summary is the median over rounds with the min-max spread. Tables name the machine and model;
``save`` writes JSON (for machines) and a PNG (for people) under benchmarks/out/.

    bench = Bench("transport", model="n/a")
    bench.add("pingpong", "ring", lambda: {"p50_us": ...})
    bench.run(rounds=5)
    print(bench.table("Round trip", [Column("p50 us", "pingpong", "p50_us", ratio_to="zmq")]))
    bench.save()
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

log = logging.getLogger("benchmarks")

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def describe_machine() -> str:
    """E.g. 'AMD EPYC 9R14, 2 CPUs, Linux 6.1, Python 3.11.7'."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release().split('-')[0]}, "
        f"Python {platform.python_version()}"
    )


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


@dataclass
class Stat:
    median: float
    lo: float
    hi: float
    n: int

    def text(self, fmt: str = "{:.3g}") -> str:
        if self.n == 0:
            return "-"
        if self.n == 1 or self.lo == self.hi:
            return fmt.format(self.median)
        return f"{fmt.format(self.median)} [{fmt.format(self.lo)}-{fmt.format(self.hi)}]"


@dataclass
class Column:
    """One table column: ``metric`` of ``scenario``, optionally as a ratio to a baseline method."""

    header: str
    scenario: str
    metric: str
    fmt: str = "{:.3g}"
    ratio_to: Optional[str] = None  # baseline method: print value / baseline (medians)
    higher_is_better: bool = False


@dataclass
class Bench:
    name: str
    model: str = "n/a"
    machine: str = field(default_factory=describe_machine)
    cases: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def add(self, scenario: str, method: str, fn: Callable[[], dict]) -> None:
        self.cases.append((scenario, method, fn))

    def run(self, rounds: int = 5, progress: Callable[[str], None] = lambda s: log.info(s)) -> None:
        """Every case once per round, alternating the order between rounds (A B A B ...)."""
        load_before = load_average()
        for r in range(rounds):
            order = self.cases if r % 2 == 0 else list(reversed(self.cases))
            for scenario, method, fn in order:
                t0 = time.perf_counter()
                metrics = fn()
                self.rows.append({"round": r, "scenario": scenario, "method": method, **metrics})
                progress(
                    f"round {r + 1}/{rounds} {scenario:>10} {method:<18} "
                    f"{time.perf_counter() - t0:6.2f} s  " + " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
                )
        self.notes.append(f"load average (1 min) before {load_before:.2f}, after {load_average():.2f}")

    def methods(self) -> list[str]:
        seen: dict = {}
        for _, method, _ in self.cases:
            seen.setdefault(method, None)
        return list(seen)

    def stat(self, scenario: str, method: str, metric: str) -> Stat:
        vals = [
            row[metric]
            for row in self.rows
            if row["scenario"] == scenario and row["method"] == method and metric in row
        ]
        if not vals:
            return Stat(float("nan"), float("nan"), float("nan"), 0)
        return Stat(statistics.median(vals), min(vals), max(vals), len(vals))

    def ratio(self, scenario: str, metric: str, method: str, baseline: str) -> float:
        return self.stat(scenario, method, metric).median / self.stat(scenario, baseline, metric).median

    def table(self, title: str, columns: list[Column], methods: Optional[list[str]] = None) -> str:
        """A Markdown table: one row per method; cells are 'median [min-max]' over rounds."""
        methods = methods or self.methods()
        header = ["method"] + [c.header for c in columns]
        lines = [
            f"**{title}** ({self.name}; machine: {self.machine}; model: {self.model})",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        for m in methods:
            cells = [m]
            for c in columns:
                s = self.stat(c.scenario, m, c.metric)
                if c.ratio_to is None:
                    cells.append(s.text(c.fmt))
                elif s.n == 0 or self.stat(c.scenario, c.ratio_to, c.metric).n == 0:
                    cells.append("-")
                else:
                    cells.append(f"{self.ratio(c.scenario, c.metric, m, c.ratio_to):.3g}x")
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def save(
        self, extra: Optional[dict] = None, plots: Optional[list[Column]] = None, out_dir: str = OUT_DIR
    ) -> list[str]:
        """Write <name>-<time>.json (every row, the summary and ``extra``) and a PNG of
        ``plots`` (one panel per column: median bars with min-max whiskers per method)."""
        os.makedirs(out_dir, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = os.path.join(out_dir, f"{self.name}-{stamp}")
        summary = {}
        for scenario, method, _ in self.cases:
            metrics = {
                k
                for row in self.rows
                if row["scenario"] == scenario and row["method"] == method
                for k in row
                if k not in ("round", "scenario", "method")
            }
            for k in sorted(metrics):
                s = self.stat(scenario, method, k)
                summary.setdefault(scenario, {}).setdefault(method, {})[k] = {
                    "median": s.median,
                    "min": s.lo,
                    "max": s.hi,
                    "rounds": s.n,
                }
        with open(base + ".json", "w") as f:
            json.dump(
                {
                    "name": self.name,
                    "machine": self.machine,
                    "model": self.model,
                    "notes": self.notes,
                    "summary": summary,
                    "rows": self.rows,
                    **(extra or {}),
                },
                f,
                indent=1,
            )
        paths = [base + ".json"]
        if plots:
            try:
                paths.append(self._plot(plots, base + ".png"))
            except ImportError:
                log.warning("matplotlib is not installed: no PNG written")
        return paths

    def _plot(self, columns: list[Column], path: str) -> str:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(columns), figsize=(4.2 * len(columns), 4.2), squeeze=False)
        for ax, c in zip(axes[0], columns):
            methods = [m for m in self.methods() if self.stat(c.scenario, m, c.metric).n]
            stats = [self.stat(c.scenario, m, c.metric) for m in methods]
            meds = [s.median for s in stats]
            err = [[s.median - s.lo for s in stats], [s.hi - s.median for s in stats]]
            ax.barh(methods, meds, xerr=err, color="#4878a8", ecolor="#333333", capsize=2)
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_title(f"{c.header}\n({'higher' if c.higher_is_better else 'lower'} is better)", fontsize=9)
            ax.invert_yaxis()
            ax.tick_params(labelsize=8)
        fig.suptitle(f"{self.name}: {self.machine}", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

"""The detector's false-positive and detection rates on synthetic series, as BENCHMARKS.md records them.

    .venv/bin/python -m ingest.studies.detect_study [--series 500] [--seed 0]    # about 3 minutes

Each series is `make_series`: per-step samples around a level with seeded noise (within a run and
between runs), with planted steps (or a step and its return); `detect_changes` at its defaults must
find exactly the planted changes and nothing else. Results go to ingest/regress/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ingest.regress.detect import Point, detect_changes


@dataclass(frozen=True)
class StudyResult:
    """Outcome of `n_series` synthetic series: how many had any confirmed change, and how many
    had exactly the planted changes (position and direction) and no others."""

    n_series: int
    n_flagged: int
    n_exact: int

    @property
    def flagged_rate(self) -> float:
        return self.n_flagged / self.n_series if self.n_series else math.nan

    @property
    def exact_rate(self) -> float:
        return self.n_exact / self.n_series if self.n_series else math.nan


def make_series(rng: np.random.Generator, length: int, samples: int, noise: float, run_noise: float = 0.0,
                steps: Iterable[tuple[int, float]] = (), base: float = 100.0) -> list[Point]:
    """A synthetic series: `base` times (1 + step) from each step's first index on, each run
    offset by N(0, run_noise) and each sample by N(0, noise), both relative."""
    level = np.full(length, base)
    for first, rel in steps:
        level[first:] *= 1 + rel
    offsets = 1 + run_noise * rng.standard_normal(length)
    return [Point(f"c{i:02d}", level[i] * offsets[i] * (1 + noise * rng.standard_normal(samples)))
            for i in range(length)]


def _plant(rng: np.random.Generator, length: int, step: float | None, round_trip: bool) -> list[tuple[int, float]]:
    """No step, one step at a random point (sign at random), or with `round_trip` a step and
    its undoing two or more points later (a regression and its fix)."""
    if step is None:
        return []
    up = rng.random() < 0.5
    if not round_trip:
        return [(int(rng.integers(1, length)), step if up else -step)]
    first = int(rng.integers(1, length - 2))
    back = int(rng.integers(first + 2, length))
    factor = 1 + step if up else 1 / (1 + step)  # a 10x step (step 9) up or down, never below 0
    return [(first, factor - 1), (back, 1 / factor - 1)]


def _simulate(n_series: int, seed: int, lengths: Sequence[int], noise_levels: Sequence[float],
              sample_counts: Sequence[int], run_noise: float, step: float | None, detect_kwargs: dict,
              round_trip: bool = False) -> StudyResult:
    rng = np.random.default_rng(seed)
    flagged = exact = 0
    for _ in range(n_series):
        length = int(rng.choice(lengths))
        noise = float(rng.choice(noise_levels))
        samples = int(rng.choice(sample_counts))
        planted = _plant(rng, length, step, round_trip)
        points = make_series(rng, length, samples, noise, run_noise, planted)
        found = detect_changes(points, higher_is_better=False, **detect_kwargs)
        flagged += bool(found)
        want = [(first, "regression" if rel > 0 else "improvement") for first, rel in planted]
        exact += [(c.first_bad, c.direction) for c in found] == want
    return StudyResult(n_series, flagged, exact)


def measure_false_positive_rate(n_series: int = 500, seed: int = 0, lengths: Sequence[int] = (5, 10, 20, 40, 60),
                                noise_levels: Sequence[float] = (0.01, 0.02, 0.03, 0.05),
                                sample_counts: Sequence[int] = (3, 5, 10, 20), run_noise: float = 0.0,
                                **detect_kwargs) -> StudyResult:
    """Flat series (no change planted), each with a length, relative sample noise and sample
    count drawn from the given choices; `flagged_rate` is the false-positive rate."""
    return _simulate(n_series, seed, lengths, noise_levels, sample_counts, run_noise, None, detect_kwargs)


def measure_detection_rate(step: float, n_series: int = 500, seed: int = 0,
                           lengths: Sequence[int] = (5, 10, 20, 40, 60),
                           noise_levels: Sequence[float] = (0.01, 0.02, 0.03, 0.05),
                           sample_counts: Sequence[int] = (3, 5, 10, 20), run_noise: float = 0.0,
                           round_trip: bool = False, **detect_kwargs) -> StudyResult:
    """Series with one step of relative size `step` (sign drawn at random) at a random point
    (the last one included), or with `round_trip` that step and its undoing later;
    `exact_rate` is the power to find them, exactly where they are."""
    return _simulate(n_series, seed, lengths, noise_levels, sample_counts, run_noise, step, detect_kwargs,
                     round_trip)


_ALL_NOISE = (0.01, 0.02, 0.03, 0.05)
_ALL_LENGTHS = (5, 10, 20, 40, 60)
_ALL_COUNTS = (3, 5, 10, 20)


def _label(values: Sequence[float], percent: bool = False) -> str:
    return ", ".join(f"{100 * v:g} %" if percent else str(v) for v in values)


def run_study(n_series: int = 500, seed: int = 0) -> str:
    """The study BENCHMARKS.md records, as Markdown tables (default `detect_changes` settings)."""
    fp_rows = [  # (lengths, samples per point, sample noise, run-to-run noise)
        (_ALL_LENGTHS, _ALL_COUNTS, _ALL_NOISE, 0.0),
        (_ALL_LENGTHS, (1,), _ALL_NOISE, 0.0),
        (_ALL_LENGTHS, (2,), _ALL_NOISE, 0.0),
        *(((length,), _ALL_COUNTS, _ALL_NOISE, 0.0) for length in _ALL_LENGTHS),
        *((_ALL_LENGTHS, _ALL_COUNTS, (0.002,), run) for run in (0.01, 0.02, 0.03)),
    ]
    lines = ["False positives: flat series, any confirmed change counts", "",
             "| points | samples per point | sample noise | run-to-run noise | series | flagged | rate |",
             "| --- | --- | --- | --- | ---: | ---: | ---: |"]
    for lengths, counts, noises, run in fp_rows:
        r = measure_false_positive_rate(n_series, seed, lengths, noises, counts, run)
        lines.append(f"| {_label(lengths)} | {_label(counts)} | {_label(noises, True)} | {_label([run], True)} | "
                     f"{r.n_series} | {r.n_flagged} | {100 * r.flagged_rate:.2f} % |")
    power_rows = [  # (lengths, samples per point, sample noise, run-to-run noise)
        *((_ALL_LENGTHS, _ALL_COUNTS, (noise,), 0.0) for noise in _ALL_NOISE),
        (_ALL_LENGTHS, _ALL_COUNTS, _ALL_NOISE, 0.0),
        *(((length,), _ALL_COUNTS, _ALL_NOISE, 0.0) for length in _ALL_LENGTHS),
        (_ALL_LENGTHS, (1,), (0.01,), 0.0),
        (_ALL_LENGTHS, _ALL_COUNTS, (0.002,), 0.01),
    ]
    lines += ["", "Detection: one step planted at a random point (the last one included), sign at random;",
              "a series counts only if exactly that change is found, at that point, and no other", "",
              "| points | samples per point | sample noise | run-to-run noise | 5 % step | 10 % step | 20 % step |",
              "| --- | --- | --- | --- | ---: | ---: | ---: |"]
    for lengths, counts, noises, run in power_rows:
        rates = [measure_detection_rate(step, n_series, seed + 1, lengths, noises, counts, run).exact_rate
                 for step in (0.05, 0.10, 0.20)]
        lines.append(f"| {_label(lengths)} | {_label(counts)} | {_label(noises, True)} | {_label([run], True)} | "
                     + " | ".join(f"{100 * x:.1f} %" for x in rates) + " |")
    lines += ["", "Detection: a step and its undoing two or more points later (a regression and its fix);",
              "a series counts only if exactly those two changes are found, where they are, and no other", "",
              "| points | samples per point | sample noise | run-to-run noise | 5 % step | 10 % step | 20 % step "
              "| 10x step |",
              "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for lengths, counts, noises, run in [((5, 6, 8), _ALL_COUNTS, _ALL_NOISE, 0.0), ((10, 20, 40), _ALL_COUNTS,
                                          _ALL_NOISE, 0.0), (_ALL_LENGTHS[:3], _ALL_COUNTS, (0.002,), 0.02)]:
        rates = [measure_detection_rate(step, n_series, seed + 2, lengths, noises, counts, run,
                                        round_trip=True).exact_rate for step in (0.05, 0.10, 0.20, 9.0)]
        lines.append(f"| {_label(lengths)} | {_label(counts)} | {_label(noises, True)} | {_label([run], True)} | "
                     + " | ".join(f"{100 * x:.1f} %" for x in rates) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ingest.studies.detect_study",
                                     description="False-positive and detection-rate study of detect_changes")
    parser.add_argument("--series", type=int, default=500, help="series per table row (default 500)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(run_study(args.series, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

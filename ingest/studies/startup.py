"""How long `python -m ingest` takes to answer before it does any work, as a user runs it:

    .venv/bin/python -m ingest.studies.startup [--repeat 9]

Each command is a fresh process started from this one, timed from start to exit (wall time),
`--repeat` times in turn, the median kept; the baseline, in the same run, is the interpreter
alone (`python -c pass`). Commands: `--help`, a usage error, and `report` of a sample run (a
database made first with `ingest samples`, not timed). Not a test: its figures depend on the
machine; they go to ingest/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET_S = 0.2  # the target for --help and report


def _wall(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ingest.studies.startup", description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=9)
    args = p.parse_args(argv)
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="stepwatch-startup-") as work:
        db = str(Path(work) / "samples.duckdb")
        subprocess.run([py, "-m", "ingest", "samples", "--db", db], cwd=ROOT, capture_output=True, check=True)
        commands = {
            "python -c pass (baseline)": [py, "-c", "pass"],
            "ingest --help": [py, "-m", "ingest", "--help"],
            "ingest import --help": [py, "-m", "ingest", "import", "--help"],
            "ingest report x (a usage error)": [py, "-m", "ingest", "report", "x"],
            "ingest report 1 (a sample run)": [py, "-m", "ingest", "report", "1", "--db", db],
            "ingest report 1 --json": [py, "-m", "ingest", "report", "1", "--json", "--db", db],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeat):  # in turn, so that a busy moment hits every command alike
            for name, command in commands.items():
                times[name].append(_wall(command))
    base = statistics.median(times["python -c pass (baseline)"])
    print(f"{'command':<34}{'median s':>10}{'min s':>8}{'over python':>13}{'target':>10}")
    for name, values in times.items():
        med = statistics.median(values)
        target = "" if "baseline" in name else ("met" if med <= TARGET_S else "NOT met")
        print(f"{name:<34}{med:>10.3f}{min(values):>8.3f}{med - base:>+12.3f}s{target:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

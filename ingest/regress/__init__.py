"""Regressions across commits, as pure functions over plain arrays and tables (no database, no I/O).

- `ingest.regress.detect`: confirmed step changes in one series along commit order (ruptures
  for the candidate change points, a Mann-Whitney rank test and a minimum effect size to
  confirm them); `python -m ingest.studies.detect_study` measures its false-positive rate.
- `ingest.regress.explain`: which kernels' change explains a step-time change between two runs.
- `ingest.regress.diagnose`: short sentences with their numbers about a run, a change, or a
  patched/unpatched pair.
- `ingest.regress.noise`: the one noise model every verdict rests on (the run is the sample, a
  commit pools its runs, the spread the series' own repeats or history, steps only a floor):
  regression / improvement / repeat / too noisy / within noise / not enough data.
- `ingest.regress.uncertainty`: two samples' verdict (changed / within noise / not enough data)
  with its interval, the run-to-run spread counted.
- `ingest.regress.consistency`: whether a run's figures agree with one another and with its
  measured tok/s, checked on every import.
- `ingest.regress.patterns`: the pattern catalog (patterns.toml beside it, and a user's file):
  rules as data, each with a sentence, evaluated on a run's kernel rows and step figures.
- `ingest.regress.report`: a commit range's changes as Markdown (`python -m ingest check`).

Following a run's series and bisecting (they read and write the database) live with the runs:
ingest.runs.track, ingest.runs.bisect. The detector's study is ingest.studies.detect_study.

May import: ingest.errors only (and numpy, scipy, pandas, ruptures). app/ and every part of ingest
may import it. Import from the modules themselves; this package only holds their exception.
"""

from ingest.errors import IngestError


class RegressError(IngestError):
    """Input that change detection, explanation or diagnosis cannot work with (says which and why)."""

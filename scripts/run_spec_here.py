"""Run reference-engine specs on this machine and leave their bundles in OUT_DIR, without the
database or the trace reader (whose packages a GPU machine may lack). The bundles are then
imported elsewhere with `python -m ingest import DIR --commit ... --repo ...`; this is how the
[runs] specs were executed on the lent H200.

    python scripts/run_spec_here.py OUT_DIR COMMIT_SHA 'SPEC_JSON' ['SPEC_JSON' ...]
"""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ingest.runs.engines.reference import run_reference  # noqa: E402
from ingest.runs.hosts import LocalHost  # noqa: E402
from ingest.runs.spec import Config, parse_spec  # noqa: E402


def main() -> None:
    out, sha, bodies = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    out.mkdir(parents=True, exist_ok=True)
    for body in bodies:
        spec = parse_spec(json.loads(body))
        print("spec:", spec.to_json(), flush=True)
        bundle = run_reference(spec, Config(), LocalHost(), work_dir_local=Path(tempfile.mkdtemp()), sha=sha,
                               on_line=lambda line: line.startswith("progress: timing") or print(line, flush=True))
        w = spec.workload
        target = out / f"spec-{w.preset}-{w.kv}-{'graph' if w.cuda_graph else 'eager'}"
        bundle.rename(target)
        print("bundle:", target, flush=True)


if __name__ == "__main__":
    main()

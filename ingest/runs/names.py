"""The engines and devices a run spec may name: what the command line offers as choices, in a
module that loads nothing (ingest/runs/spec.py checks specs against them)."""

ENGINES = ("reference", "sglang", "import")
DEVICES = ("cpu", "cuda")

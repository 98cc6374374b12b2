"""Benchmark runs: specs, engines (reference, sglang, import), hosts (local, SSH) and the job
queue's worker. Results travel as bundles (kernels/bundle.py); only the process that imports
a bundle writes the database."""

"""stepwatch ingest: read torch.profiler traces into per-step, per-kernel figures."""

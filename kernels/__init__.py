"""stepwatch kernels: reference MLA decode workload, FP8 KV kernels, benchmark runner, bundle format."""

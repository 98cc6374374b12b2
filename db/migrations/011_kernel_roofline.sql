-- Each kernel row's roofline (ingest/traces/roofline.py, from the cost models of
-- ingest/traces/costs.py): its launching op's FLOPs and bytes per call (read + written; an op's
-- cost spread over its kernels by time), their ratio (FLOP per byte), the achieved TFLOP/s and
-- TB/s, the fractions of the device's datasheet peaks (compute: of the peak for the op's unit,
-- bf16 / fp8 / fp32 / tf32 / vector; bandwidth: of HBM), and the bound: 'compute', 'memory',
-- 'latency' (under a tenth of both roofs) or 'communication'. NULL where unknown (no shapes,
-- an op without a model, a CUDA-graph replay, an unknown device) and for runs imported before.
ALTER TABLE kernel_stats ADD COLUMN flops_per_call DOUBLE;
ALTER TABLE kernel_stats ADD COLUMN model_bytes_per_call DOUBLE;
ALTER TABLE kernel_stats ADD COLUMN intensity DOUBLE;
ALTER TABLE kernel_stats ADD COLUMN tflops DOUBLE;
ALTER TABLE kernel_stats ADD COLUMN tbps DOUBLE;
ALTER TABLE kernel_stats ADD COLUMN compute_fraction DOUBLE;
ALTER TABLE kernel_stats ADD COLUMN bandwidth_fraction DOUBLE;
ALTER TABLE kernel_stats ADD COLUMN bound VARCHAR;

-- The device's ceilings those fractions are of (ingest/traces/devices.toml): {"device", "basis":
-- "datasheet", "datasheet": {hbm_gbps, bf16_tflops, ...}, "measured": {..., "source"} or null};
-- NULL for an unknown device, a CPU-only trace, and runs imported before.
ALTER TABLE runs ADD COLUMN roofline JSON;

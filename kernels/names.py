"""The reference workload's presets and KV strategies by name, without importing torch (forms
and spec checks need the names; kernels.workload holds what they mean)."""

PRESET_NAMES = ("glm5", "deepseek-v3", "tiny")
KV_STRATEGIES = ("full-pool-cast", "gather-then-cast", "fused")

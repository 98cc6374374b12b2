"""The values SGLang accepts for the enumerated flags the sglang engine passes, as sglang 0.5.23
declares them. A spec is checked against them when it is parsed (ingest/runs/spec.py), so a
value SGLang would refuse, e.g. `--kv-cache-dtype fp8`, is refused before anything runs rather
than by SGLang's argparse at run time. tests/test_sglang_flags.py reads the 0.5.23 wheel's
sources and checks that these lists equal its choices, in order.

Sources in the sglang 0.5.23 wheel:
- load_format: `sglang/srt/arg_groups/fields/model.py:58` (`choices=LOAD_FORMAT_CHOICES`), the
  list at `sglang/srt/arg_groups/choices.py:3`;
- kv_cache_dtype: `sglang/srt/arg_groups/fields/model.py:197`, a literal `choices=[...]`;
- attention_backend: `sglang/srt/arg_groups/fields/exec_.py:207`
  (`choices=ATTENTION_BACKEND_CHOICES`), the list at `sglang/srt/arg_groups/choices.py:69`.
  Plugins can add backends at run time (`add_attention_backend_choices`); such a value, or one
  of another release, can still be passed unchecked in `extra_args` as `--flag=value`.
"""

from __future__ import annotations

SGLANG_RELEASE = "0.5.23"

LOAD_FORMAT_CHOICES = (
    "auto", "pt", "safetensors", "instanttensor", "npcache", "dummy", "sharded_state", "presharded", "gguf",
    "expert_pack", "bitsandbytes", "mistral", "layered", "flash_rl", "remote", "remote_instance",
    "fastsafetensors", "private", "runai_streamer",
)
KV_CACHE_DTYPE_CHOICES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
ATTENTION_BACKEND_CHOICES = (
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa3", "fa4",
    "flashinfer", "llada2_cfg_flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla",
    "trtllm_mha", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave", "intel_amx",
    "ascend", "intel_xpu",
)

# Workload field -> (the flag it becomes, the values SGLang accepts).
FLAG_CHOICES: dict[str, tuple[str, tuple[str, ...]]] = {
    "load_format": ("--load-format", LOAD_FORMAT_CHOICES),
    "kv_cache_dtype": ("--kv-cache-dtype", KV_CACHE_DTYPE_CHOICES),
    "attention_backend": ("--attention-backend", ATTENTION_BACKEND_CHOICES),
}


def find_choice_problem(field: str, value: str) -> str | None:
    """Why SGLang would refuse `value` for the workload field `field`, or None if it accepts it
    (or the field is not an enumerated flag). One line, naming the value and the allowed ones."""
    if field not in FLAG_CHOICES:
        return None
    flag, choices = FLAG_CHOICES[field]
    if value in choices:
        return None
    return (f"{value!r} is not one of sglang {SGLANG_RELEASE}'s {flag} choices: {', '.join(choices)} "
            f"(another release's value can go unchecked in extra_args as {flag}={value})")

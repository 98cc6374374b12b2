"""A reference MLA decode step shaped like SGLang's absorbed-MLA decode, with a paged FP8 KV pool.

Per layer: RMSNorm -> fused q/latent-KV projection -> write the new token's latent row into the
FP8 pool (cast + index write, as SGLang's set_kv_buffer) -> fetch the batch's KV rows as BF16
(the KV strategy) -> scores over all 576 dims, softmax, output over the first 512
(kv_lora_rank) -> o projection -> residual -> RMSNorm -> MLP (gate_up, silu * up, down) ->
residual. About 18 kernels per layer, so profiler traces stay small.

KV strategies:
- `full-pool-cast`: cast the whole layer pool to BF16, then index it (SGLang's flashinfer MLA
  backend: `get_key_buffer(layer_id).to(q.dtype)`).
- `gather-then-cast`: index the FP8 rows, then cast them (torch ops).
- `fused`: one Triton gather-cast kernel reading the active row count from device memory.

Weights are BF16 everywhere (CPU too), random and seeded; the pool holds uint8-stored FP8 with
no NaN patterns, its context rows distinct random rows as a page-size-1 allocator leaves them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn.functional as F

from kernels.kv_cast import BF16, FP8, gather_cast_fp8_to_bf16

from kernels.names import KV_STRATEGIES, PRESET_NAMES  # noqa: E402  (names without torch)


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the reference model and of one decode batch (token counts, dims, bytes are plain ints)."""

    preset: str
    layers: int
    pool_tokens: int
    kv_lora_rank: int = 512
    rope_dim: int = 64
    heads: int = 16
    hidden: int = 2048
    intermediate: int = 4096
    batch_size: int = 1
    context: int = 2048
    seed: int = 0

    @property
    def kv_dim(self) -> int:
        """Elements per latent KV row (kv_lora_rank + rope_dim; 576 for GLM-5/DeepSeek-V3)."""
        return self.kv_lora_rank + self.rope_dim

    @property
    def active_rows(self) -> int:
        """KV rows one decode step reads: each sequence's context plus its new token."""
        return self.batch_size * (self.context + 1)

    def describe(self) -> dict:
        """Every parameter plus the derived dims, for a bundle's `workload`."""
        return {**asdict(self), "kv_dim": self.kv_dim, "active_rows": self.active_rows}


PRESETS = {
    "glm5": ModelConfig(preset="glm5", layers=78, pool_tokens=495_000),
    "deepseek-v3": ModelConfig(preset="deepseek-v3", layers=61, pool_tokens=495_000),
    "tiny": ModelConfig(
        preset="tiny", layers=4, pool_tokens=4096, heads=4, hidden=256, intermediate=512, context=128
    ),
}


assert tuple(PRESETS) == PRESET_NAMES, "kernels/names.py must list the presets defined here"


def get_config(preset: str, **overrides) -> ModelConfig:
    """Return the preset's config with the given fields replaced (None values are ignored)."""
    if preset not in PRESETS:
        raise ValueError(f"preset: {preset!r}, expected one of {', '.join(PRESETS)}")
    names = {f.name for f in fields(ModelConfig)}
    unknown = set(overrides) - names
    if unknown:
        raise ValueError(f"unknown config field(s): {', '.join(sorted(unknown))}")
    cfg = replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})
    for name in ("layers", "pool_tokens", "heads", "hidden", "intermediate", "batch_size", "context"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name}: {getattr(cfg, name)}, must be positive")
    if cfg.active_rows > cfg.pool_tokens:
        raise ValueError(f"pool_tokens: {cfg.pool_tokens} is smaller than batch_size * (context + 1)"
                         f" = {cfg.active_rows}")
    return cfg


def count_weight_bytes(cfg: ModelConfig) -> int:
    """Bytes of BF16 weights one decode step reads (all layers, norms included)."""
    per_layer = (
        cfg.hidden * (cfg.heads * cfg.kv_dim + cfg.kv_dim)  # fused q + latent KV projection
        + cfg.heads * cfg.kv_lora_rank * cfg.hidden  # o projection
        + cfg.hidden * 2 * cfg.intermediate  # gate_up
        + cfg.intermediate * cfg.hidden  # down
        + 2 * cfg.hidden  # two RMSNorm weights
    )
    return 2 * per_layer * cfg.layers


def count_floor_bytes(cfg: ModelConfig) -> int:
    """Bytes a decode step cannot avoid moving: weights, the active FP8 KV rows, the new rows."""
    kv_read = cfg.layers * cfg.active_rows * cfg.kv_dim
    kv_write = cfg.layers * cfg.batch_size * cfg.kv_dim
    return count_weight_bytes(cfg) + kv_read + kv_write


@dataclass
class LayerWeights:
    norm1: torch.Tensor  # [hidden]
    w_qkv: torch.Tensor  # [heads * kv_dim + kv_dim, hidden]
    w_o: torch.Tensor  # [hidden, heads * kv_lora_rank]
    norm2: torch.Tensor  # [hidden]
    w_gate_up: torch.Tensor  # [2 * intermediate, hidden]
    w_down: torch.Tensor  # [hidden, intermediate]


@dataclass
class ModelState:
    """Weights, KV pools and the batch's static index buffers, all on one device."""

    cfg: ModelConfig
    device: torch.device
    layers: list[LayerWeights]
    pools: list[torch.Tensor]  # per layer [pool_tokens, kv_dim] uint8 (FP8 bits)
    rows: torch.Tensor  # [active_rows] int64: per sequence its context rows, then its new row
    new_rows: torch.Tensor  # [batch_size] int64: where each sequence's new token is written
    n_active: torch.Tensor  # [1] int64 on the device: rows.numel()
    x_in: torch.Tensor  # [batch_size, hidden] BF16 static decode input


def _randn(shape, scale: float, gen: torch.Generator, device) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(BF16)


def fill_fp8_pool(tokens: int, dim: int, gen: torch.Generator, device) -> torch.Tensor:
    """Random uint8-stored FP8 rows with |x| < 2 and no NaN (bit 6 of each byte cleared)."""
    pool = torch.randint(0, 256, (tokens, dim), generator=gen, device=device, dtype=torch.uint8)
    return pool.bitwise_and_(0xBF)


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu") -> ModelState:
    """Create seeded random weights, pools and the batch's row indices on `device`."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    h, kv, lora = cfg.hidden, cfg.kv_dim, cfg.kv_lora_rank
    layers = []
    for _ in range(cfg.layers):
        w_qkv = _randn((cfg.heads * kv + kv, h), 1 / math.sqrt(h), gen, device)
        w_qkv[: cfg.heads * kv] *= 1 / math.sqrt(kv)  # fold the attention scale into q
        layers.append(LayerWeights(
            norm1=torch.ones(h, dtype=BF16, device=device),
            w_qkv=w_qkv,
            w_o=_randn((h, cfg.heads * lora), 1 / math.sqrt(cfg.heads * lora), gen, device),
            norm2=torch.ones(h, dtype=BF16, device=device),
            w_gate_up=_randn((2 * cfg.intermediate, h), 1 / math.sqrt(h), gen, device),
            w_down=_randn((h, cfg.intermediate), 1 / math.sqrt(cfg.intermediate), gen, device),
        ))
    pools = [fill_fp8_pool(cfg.pool_tokens, kv, gen, device) for _ in range(cfg.layers)]
    # Row choice on the CPU so that every device gets the same rows for a seed.
    cpu_gen = torch.Generator().manual_seed(cfg.seed)
    picked = torch.randperm(cfg.pool_tokens, generator=cpu_gen)[: cfg.active_rows]
    rows = picked.view(cfg.batch_size, cfg.context + 1)
    x_in = _randn((cfg.batch_size, h), 1.0, gen, device)
    return ModelState(
        cfg=cfg,
        device=device,
        layers=layers,
        pools=pools,
        rows=rows.reshape(-1).to(device),
        new_rows=rows[:, -1].contiguous().to(device),
        n_active=torch.tensor([cfg.active_rows], dtype=torch.int64, device=device),
        x_in=x_in,
    )


class DecodeWorkload:
    """One decode step over a ModelState with a KV strategy, run eagerly or as a CUDA graph."""

    def __init__(self, state: ModelState, kv: str, cuda_graph: bool = False):
        if kv not in KV_STRATEGIES:
            raise ValueError(f"kv: {kv!r}, expected one of {', '.join(KV_STRATEGIES)}")
        if cuda_graph and state.device.type != "cuda":
            raise ValueError("cuda_graph: needs a CUDA device")
        self.state, self.kv, self.cuda_graph = state, kv, cuda_graph
        cfg = state.cfg
        self._kv_rows = torch.empty((cfg.active_rows, cfg.kv_dim), dtype=BF16, device=state.device)
        self._graph = None
        self._out = None
        if cuda_graph:
            self._capture()

    def _fetch_kv(self, pool: torch.Tensor) -> torch.Tensor:
        """The batch's KV rows as BF16 [active_rows, kv_dim], by the chosen strategy."""
        s = self.state
        if self.kv == "full-pool-cast":
            return pool.view(FP8).to(BF16)[s.rows]
        if self.kv == "gather-then-cast":
            return pool[s.rows].view(FP8).to(BF16)
        return gather_cast_fp8_to_bf16(pool, s.rows, s.n_active, out=self._kv_rows)

    def _run_layer(self, x: torch.Tensor, w: LayerWeights, pool: torch.Tensor) -> torch.Tensor:
        cfg, s = self.state.cfg, self.state
        b, heads, kv, lora = cfg.batch_size, cfg.heads, cfg.kv_dim, cfg.kv_lora_rank
        h = F.rms_norm(x, (cfg.hidden,), w.norm1, eps=1e-6)
        qkv = F.linear(h, w.w_qkv)
        q = qkv[:, : heads * kv].view(b, heads, kv)
        pool[s.new_rows] = qkv[:, heads * kv :].to(FP8).view(torch.uint8)  # set_kv_buffer
        k = self._fetch_kv(pool).view(b, cfg.context + 1, kv)
        probs = torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)
        attn = torch.bmm(probs, k[:, :, :lora])  # [b, heads, lora]: values are the latent part
        x = x + F.linear(attn.reshape(b, heads * lora), w.w_o)
        h = F.rms_norm(x, (cfg.hidden,), w.norm2, eps=1e-6)
        gate, up = F.linear(h, w.w_gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w.w_down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run every layer on `x` [batch_size, hidden] BF16; return the new hidden state."""
        for w, pool in zip(self.state.layers, self.state.pools):
            x = self._run_layer(x, w, pool)
        return x

    def _capture(self) -> None:
        """Warm up on a side stream, then capture one whole decode step into a CUDA graph."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.forward(self.state.x_in)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._out = self.forward(self.state.x_in)
        torch.cuda.synchronize()

    def run_step(self) -> torch.Tensor:
        """Run one decode step (replaying the graph in CUDA-graph mode); return its output."""
        if self._graph is not None:
            self._graph.replay()
            return self._out
        return self.forward(self.state.x_in)

    def release(self) -> None:
        """Drop the graph and scratch buffers so their memory can be reused."""
        self._graph = None
        self._out = None
        self._kv_rows = None

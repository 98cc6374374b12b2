"""The live gather over a decode step, and its row ids' L2 policy: `python -m kernels.studies.step_study --out $OUT`.

kernels.studies.serving_grid times one call at a time with L2 flushed before it. A decode step is
different in one way that matters at bs 32 x 1K: every layer reads the same row ids (the rows path's
snapshot, taken once per step after the plan) or the same page plan (the pages paths, since the plan
is computed once per forward), while each layer's pool rows and scratch are its own. Whether layer 2..N
find those ids in L2 depends on what the rest of the layer streams through it (weight GEMMs: hundreds
of MB) and on the loads' eviction policy: `LIVE_CONFIG["IDS_EVICT"]` = "evict_last" marks the count and
row-id lines last to be evicted, "" leaves the default.

StepTimer replays one CUDA graph of [per-step work] + LAYERS x [flush L2 (256 MB written), call] and
reads every kernel's duration from a profile (CUPTI), as KernelTimer does for one call: the per-step
work (the rows path's snapshot copy, or the pages paths' plan), the first layer's call and the later
layers' (median), and the mean over the step's layers -- what a step pays per layer. The flush stands
for the layer's other traffic: ordinary writes, more than five times L2. ColdTimer and KernelTimer
(serving_grid's) time the same calls one at a time too, each variant after the flush, with no per-step work
in the graph (so with "evict_last" their later rounds find the ids where the earlier ones left them).

Variants: rows (gather_cast_live_rows, index rewrite), pages of 1 and 64 planned once per step
(gather_cast_planned_pages after plan_live_pages), and pages of 64 planned in every call (what the
patch did before), each with IDS_EVICT "" and "evict_last", every one bit-exact at every point.
Buffers are not shared between the two policies, the default's are timed first at each point, and the
"evict_last" lines are read back with "evict_first" afterwards, so no variant inherits another's.
Results: study.json and study.log under --out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from kernels import kv_cast
from kernels.kv_cast import (
    BF16,
    FP8,
    HAS_TRITON,
    cast_fp8_to_bf16,
    copy_live_indices,
    gather_cast_live_pages,
    gather_cast_live_rows,
)
from kernels.studies.serving_grid import (
    DIM,
    LAYERS,
    ColdTimer,
    KernelTimer,
    PagePlan,
    Point,
    StepTimer,
    StudyLog,
    ctx_pages,
    describe_time,
    make_pool,
    measure_copy,
    same_bits,
)

POINTS = ((131_072, 32, 1024), (1_048_576, 32, 1024), (1_048_576, 128, 1024), (1_048_576, 32, 8192),
          (1_048_576, 8, 1024), (1_048_576, 1, 8192), (1_048_576, 1, 1024), (1_048_576, 32, 32_768))
POLICIES = ("", "evict_last")

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _demote_kernel(ptr, n, BLOCK: tl.constexpr):
        """Read [0, n) with evict_first, so lines an evict_last load marked go first again."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(ptr + i, mask=i < n, eviction_policy="evict_first")
        tl.store(ptr + i, x, mask=(i < n) & (x == -123456789))  # never true: keeps the load


def demote(t: torch.Tensor) -> None:
    flat = t.view(-1).view(torch.int32) if t.element_size() == 4 else t.view(-1)
    _demote_kernel[(triton.cdiv(flat.numel(), 1024),)](flat, flat.numel(), BLOCK=1024)


def with_policy(policy: str, fn):
    saved = kv_cast.LIVE_CONFIG.get("IDS_EVICT", "")
    kv_cast.LIVE_CONFIG["IDS_EVICT"] = policy
    try:
        return fn()
    finally:
        kv_cast.LIVE_CONFIG["IDS_EVICT"] = saved


def time_point(log, pt: Point, scratch: torch.Tensor, copy_tb: float, timers: dict) -> dict:
    dev = pt.pool.device
    moved = 3 * pt.live_rows * DIM
    ids = pt.index.clone()  # the planned row ids, as the wrapper's buffer holds them before a step
    row = {"pool": pt.pool_tokens, "bs": pt.bs, "ctx": pt.ctx, "live_rows": pt.live_rows, "variants": {},
           "checks": {}}
    src = pt.pool[: pt.live_rows]
    row["contiguous_cast_kernel_us"] = timers["kernel"].time_us(
        lambda: cast_fp8_to_bf16(src, scratch[: pt.live_rows].view(src.shape)))
    tables = {page: pt.table(page) for page in (1, 64)}
    demoted = []
    for policy in POLICIES:
        tag = policy or "default"
        # rows path: own copies of the row ids, count and index for each policy
        rows, count, index = pt.rows.clone(), pt.count.clone(), ids.clone()
        compact = scratch[: pt.rows_capacity()]

        def rows_step():
            copy_live_indices(ids, count, rows)  # the patch's save() after each plan: once per step

        def rows_call():
            gather_cast_live_rows(pt.pool, rows, count, compact, index=index)

        cells = {}
        for name, fn in (("cold", lambda: timers["cold"].time_us(rows_call)),
                         ("kernel", lambda: timers["kernel"].time_us(rows_call)),
                         ("step", lambda: timers["step"].time_step(rows_step, rows_call))):
            got = with_policy(policy, fn)
            cells[name] = describe_time(got, moved, copy_tb) if isinstance(got, float) else got
        want = pt.pool[pt.tokens.flatten().long()].view(FP8).to(BF16)
        index.copy_(ids)
        with_policy(policy, rows_call)
        row["checks"][f"rows_{tag}"] = same_bits(compact[: pt.live_rows].view(-1, DIM), want) and torch.equal(
            index[: pt.live_rows].cpu(), torch.arange(pt.live_rows, dtype=torch.int32))
        row["variants"][f"rows_{tag}"] = cells
        if policy:
            demoted += [rows, count]
        for page in (1, 64):
            table = tables[page]
            plan = PagePlan(table, pt.lens, page, pt.pool_tokens)
            out = scratch[: plan.capacity * page]
            pages_step = plan.plan

            def pages_call():
                plan.gather(pt.pool, out)

            cells = {}
            for name, fn in (("cold", lambda: (pages_step(), timers["cold"].time_us(pages_call))[1]),
                             ("kernel", lambda: (pages_step(), timers["kernel"].time_us(pages_call))[1]),
                             ("step", lambda: timers["step"].time_step(pages_step, pages_call))):
                got = with_policy(policy, fn)
                cells[name] = describe_time(got, moved, copy_tb) if isinstance(got, float) else got
            cells["plan_kernel_us"] = timers["kernel"].time_us(pages_step)
            with_policy(policy, lambda: (pages_step(), pages_call()))
            n = ctx_pages(pt.ctx, page)
            used = plan.table_out[:, :n].flatten().long()
            got_rows = out.view(-1, page, DIM)[used].view(-1, DIM)
            want_rows = pt.pool.view(-1, page, DIM)[table[:, :n].flatten().long()].view(FP8).to(BF16).view(-1, DIM)
            row["checks"][f"pages{page}_{tag}"] = same_bits(got_rows, want_rows) and torch.equal(
                used.sort().values.cpu(), torch.arange(pt.live_rows // page))
            row["variants"][f"pages{page}_planned_{tag}"] = cells
            if policy:
                demoted += [plan.flat, plan.count]
        # the pages path as the patch had it: plan and gather in every call (kernel-timed: both kernels)
        table = tables[64]
        out = scratch[: min(pt.pool_tokens // 64, table.numel()) * 64]
        table_out = torch.empty_like(table)
        row["variants"][f"pages64_every_call_{tag}"] = {"kernel": describe_time(with_policy(
            policy, lambda: timers["kernel"].time_us(
                lambda: gather_cast_live_pages(pt.pool, table, pt.lens, 64, out, table_out))), moved, copy_tb)}
        for t in demoted:
            demote(t)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        log(f"{pt.pool_tokens} bs {pt.bs} ctx {pt.ctx} {tag}: " + "; ".join(
            f"{k}: " + ", ".join(f"{n} {c['us'] if 'us' in c else c}" for n, c in v.items() if isinstance(c, dict))
            for k, v in row["variants"].items() if k.endswith(tag)))
    return row


CONFIGS = {  # --sweep: LIVE_CONFIG overrides, each timed kernel-only at every point (IDS_EVICT evict_last)
    "base": {},
    "pps18": {"PROGRAMS_PER_SM": 18},
    "pps24": {"PROGRAMS_PER_SM": 24},
    "rows4": {"ROWS": 4},
    "c512w4": {"CHUNKS": 512, "num_warps": 4, "PROGRAMS_PER_SM": 64},
    "c512w4_pps32": {"CHUNKS": 512, "num_warps": 4},
    "c256w4": {"CHUNKS": 256, "num_warps": 4, "PROGRAMS_PER_SM": 64},
    "c2048": {"CHUNKS": 2048},
    "base_default_ids": {"IDS_EVICT": ""},
    # session 10's candidates, each named by its tile (ROWS 4, IDS_EVICT evict_last as LIVE_CONFIG)
    "v8_c1024_w8": {"CHUNKS": 1024, "VEC": 8, "num_warps": 8},
    "v16_c256_w4": {"CHUNKS": 256, "VEC": 16, "num_warps": 4},
    "v8_c2048_w8": {"CHUNKS": 2048, "VEC": 8, "num_warps": 8},
    "v8_c1024_w8_again": {"CHUNKS": 1024, "VEC": 8, "num_warps": 8},
    "v16_c256_w4_again": {"CHUNKS": 256, "VEC": 16, "num_warps": 4},
}


def sweep_point(log, pt: Point, scratch: torch.Tensor, copy_tb: float, timer: KernelTimer, names: list[str]) -> dict:
    """Kernel-timed rows, pages (1) and pages (64) planned, under each configuration in `names`."""
    moved = 3 * pt.live_rows * DIM
    ids = pt.index.clone()
    row = {"pool": pt.pool_tokens, "bs": pt.bs, "ctx": pt.ctx, "live_rows": pt.live_rows, "configs": {}, "checks": {}}
    saved = dict(kv_cast.LIVE_CONFIG)
    tables = {page: pt.table(page) for page in (1, 64)}
    try:
        for name in names:
            kv_cast.LIVE_CONFIG.clear()
            kv_cast.LIVE_CONFIG.update({**saved, "IDS_EVICT": "evict_last", **CONFIGS[name]})
            rows, count, index = pt.rows.clone(), pt.count.clone(), ids.clone()
            compact = scratch[: pt.rows_capacity()]
            cells = {"rows": describe_time(timer.time_us(
                lambda: gather_cast_live_rows(pt.pool, rows, count, compact, index=index)), moved, copy_tb)}
            want = pt.pool[pt.tokens.flatten().long()].view(FP8).to(BF16)
            ok = same_bits(compact[: pt.live_rows].view(-1, DIM), want)
            for page in (1, 64):
                table = tables[page]
                plan = PagePlan(table, pt.lens, page, pt.pool_tokens)
                out = scratch[: plan.capacity * page]
                plan.plan()
                cells[f"pages{page}"] = describe_time(timer.time_us(lambda: plan.gather(pt.pool, out)), moved, copy_tb)
                n = ctx_pages(pt.ctx, page)
                used = plan.table_out[:, :n].flatten().long()
                ok = ok and same_bits(out.view(-1, page, DIM)[used].view(-1, DIM), pt.pool.view(-1, page, DIM)[
                    table[:, :n].flatten().long()].view(FP8).to(BF16).view(-1, DIM))
                demote(plan.flat)
                demote(plan.count)
            demote(rows)
            demote(count)
            row["configs"][name] = cells
            row["checks"][name] = ok
            log(f"{pt.pool_tokens} bs {pt.bs} ctx {pt.ctx} {name}: " + ", ".join(
                f"{k} {c['us']} ({c['fraction_of_copy']})" for k, c in cells.items()) + ("" if ok else " NOT EXACT"))
    finally:
        kv_cast.LIVE_CONFIG.clear()
        kv_cast.LIVE_CONFIG.update(saved)
    return row


def overflow_point(log, pool: torch.Tensor, copy_tb: float, timer: KernelTimer) -> dict:
    """More live entries than the pool has rows (requests sharing prefix pages): the pages paths
    cast the whole pool in place, the rows path the referenced rows; against the stock `.to()` and
    the Triton whole-buffer cast, kernel-timed. Bytes: the pool's (read once, written once)."""
    dev = pool.device
    tokens = pool.shape[0]
    moved = 3 * tokens * DIM
    gen = torch.Generator(device=dev).manual_seed(31)
    out = torch.empty(tokens, 1, DIM, dtype=BF16, device=dev)
    want = pool.view(FP8).to(BF16).view(tokens, 1, DIM)
    row = {"pool": tokens, "variants": {}, "checks": {}}
    row["variants"]["whole_pool_to"] = describe_time(timer.time_us(lambda: pool.view(FP8).to(BF16)), moved, copy_tb)
    row["variants"]["triton_whole_cast"] = describe_time(
        timer.time_us(lambda: cast_fp8_to_bf16(pool, out.view(tokens, DIM))), moved, copy_tb)
    for page in (1, 64):
        pool_pages = tokens // page
        bs = 32
        table = torch.randint(0, pool_pages, (bs, pool_pages), generator=gen, device=dev, dtype=torch.int32)
        lens = torch.full((bs,), pool_pages * page, dtype=torch.int32, device=dev)
        plan = PagePlan(table, lens, page, tokens)
        plan.plan()
        out.zero_()
        row["variants"][f"pages{page}_overflow"] = describe_time(timer.time_us(lambda: plan.gather(pool, out)),
                                                                 moved, copy_tb)
        row["checks"][f"pages{page}"] = (same_bits(out.view(-1, DIM), want.view(-1, DIM))
                                         and torch.equal(plan.table_out, table))
    index = torch.randint(0, tokens, (2 * tokens,), generator=gen, device=dev, dtype=torch.int32)
    count = torch.tensor([2 * tokens], dtype=torch.int32, device=dev)
    out.zero_()
    row["variants"]["rows_overflow_2x"] = describe_time(timer.time_us(
        lambda: gather_cast_live_rows(pool, index[:tokens].clone(), count, out, index=index)), 2 * moved, copy_tb)
    used = index.long().unique()
    row["checks"]["rows"] = same_bits(out.view(-1, DIM)[used], want.view(-1, DIM)[used])
    log(f"overflow, pool {tokens}: " + ", ".join(f"{k} {v['us']} us ({v['fraction_of_copy']})"
                                                 for k, v in row["variants"].items()) + f"; exact {row['checks']}")
    return row


def summarize(points: list[dict]) -> str:
    lines = ["pool bs ctx | variant | cold us (of copy) | kernel us (of copy) | step: first / later median / "
             "mean per layer us (mean of copy) | per-step us"]
    for p in points:
        lines.append(f"{p['pool']} bs {p['bs']} ctx {p['ctx']} "
                     f"(contiguous cast {p['contiguous_cast_kernel_us']:.2f} us)")
        for name, c in p["variants"].items():
            cold, kern, step = c.get("cold"), c.get("kernel"), c.get("step")
            cells = [f"{x['us']:.2f} ({x['fraction_of_copy']:.3f})" if x else "-" for x in (cold, kern)]
            if step:
                mean = step["mean_per_layer_us"]
                frac = kern["fraction_of_copy"] * kern["us"] / mean if kern else float("nan")
                cells.append(f"{step['first_layer_us']:.2f} / {step['later_layers_median_us']:.2f} / {mean:.2f} "
                             f"({frac:.3f}) | {step['per_step_us']}")
            lines.append(f"   {name:<28} " + " | ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.studies.step_study")
    p.add_argument("--out", required=True)
    p.add_argument("--points", default="all", help="'all' or indices into POINTS, comma-separated")
    p.add_argument("--sweep", default="", help="CONFIGS names, comma-separated: kernel-timed configurations instead")
    p.add_argument("--overflow", action="store_true", help="time the overflow (shared pages) paths instead")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or not HAS_TRITON:
        print("python -m kernels.studies.step_study: error: needs CUDA and triton", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = StudyLog(out / "study.log")

    dev = torch.device("cuda")

    class _Run:  # what measure_copy needs
        device = dev

    timers = {"cold": ColdTimer(dev), "kernel": KernelTimer(dev), "step": StepTimer(dev)}
    copy = measure_copy(_Run(), timers["cold"])
    log(f"copy {copy}; LIVE_CONFIG {kv_cast.LIVE_CONFIG}")
    points = POINTS if args.points == "all" else [POINTS[int(i)] for i in args.points.split(",")]
    pools = {t: make_pool(t, dev, seed=t % 97) for t in {t for t, _, _ in points}}
    scratch = torch.empty(max(pools), 1, DIM, dtype=BF16, device=dev)
    results = {"copy": copy, "live_config": dict(kv_cast.LIVE_CONFIG), "layers": LAYERS, "points": []}
    if args.overflow:
        results["overflow"] = [overflow_point(log, pools[t], copy["tb_per_s"], timers["kernel"]) for t in sorted(pools)]
        (out / "study.json").write_text(json.dumps(results, indent=1) + "\n")
        bad = [(r["pool"], k) for r in results["overflow"] for k, ok in r["checks"].items() if not ok]
        log(f"exact: {not bad} {bad or ''}")
        return 1 if bad else 0
    for pool_tokens, bs, ctx in points:
        pt = Point(pools[pool_tokens], bs, ctx, seed=bs * 1000 + ctx)
        if args.sweep:
            results["points"].append(sweep_point(log, pt, scratch, copy["tb_per_s"], timers["kernel"],
                                                 args.sweep.split(",")))
        else:
            results["points"].append(time_point(log, pt, scratch, copy["tb_per_s"], timers))
        (out / "study.json").write_text(json.dumps(results, indent=1) + "\n")
        del pt
        torch.cuda.empty_cache()
    results["total_seconds"] = round(log.elapsed_s(), 1)
    (out / "study.json").write_text(json.dumps(results, indent=1) + "\n")
    if not args.sweep:
        log("\n" + summarize(results["points"]))
    bad = [(p["pool"], p["bs"], p["ctx"], k) for p in results["points"] for k, ok in p["checks"].items() if not ok]
    log(f"exact: {not bad} {bad or ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

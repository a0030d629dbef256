"""Tile configurations for the ``tl.dot`` templates (Matmul, Conv): the ``Config`` a template is written
with, the candidates ``--tune`` benchmarks, and the one chooser that picks a config without a GPU.

What it is: ``Config``; ``Shape`` (what a choice depends on: kind, dot mode, M bucketed to a power of two,
N, K, batch); ``candidates`` (a short list pruned by shared memory); ``choose`` = the committed per-SM table
(``tables/sm_NN.json``) when it has the shape, else ``heuristic``. The tuning cache (aot/tune.py) sits in
front of ``choose`` when the build asks for ``--tune``; without it the choice is a pure function of the
shape and the SM, so packages stay byte-identical.
The same machinery serves the fused attention (kind "attention"/"attention_causal": BLOCK_M x BLOCK_N over
queries x keys, ``block_k`` the head dim) and big reductions (kind "reduce": ``block_m`` rows a program,
``block_n`` the row block, ``num_warps``), whose defaults are rules rather than a cost model.
What it is not: a benchmark. The heuristic's cost model only ranks candidates.

Note (heuristic): a tile's time is modelled as waves x the tile's work at a per-tile efficiency, against a
memory floor that only a well-filled chip reaches. So a 128x128 tile wins for large shapes, and when the
big tile leaves most of the SMs idle (GPT-2 at 1x256: M=256, N=768 -> 12 tiles on 132 SMs) smaller tiles
that fill the chip win. On sm_90 the 16-bit candidates keep BLOCK_M >= 64, BLOCK_K 64 and warps a multiple
of 4, which is what makes Triton emit wgmma; fp32 without ``--precision bf16`` runs on the FMA units, where
the tiles that keep 32-64 accumulators a thread are the fast ones.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

from ...ir import DType
from ...options import BuildOptions

# SMs of the usual part per compute capability (sm_90: H100/H200; sm_80: A100); the tuner reads the real count.
SM_COUNT = {75: 40, 80: 108, 86: 84, 89: 128, 90: 132, 100: 148, 120: 84}
# Shared memory one block may opt into, bytes (cuDeviceGetAttribute MAX_SHARED_MEMORY_PER_BLOCK_OPTIN).
SMEM = {75: 65536, 80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 120: 101376}
# Per-SM dense throughput in TFLOP/s (16-bit tensor cores, fp32 FMA) and HBM TB/s, for ranking only.
PEAK = {80: (2.9, 0.18, 2.0), 90: (6.0, 0.5, 4.8)}


@dataclass(frozen=True, order=True)
class Config:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages} g{self.group_m}"

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Config:
        return Config(**{k: int(d[k]) for k in ("block_m", "block_n", "block_k", "num_warps", "num_stages", "group_m")})

    def smem(self, itemsize: int) -> int:
        """Shared memory of the pipelined operand tiles (what Triton allocates, give or take the epilogue)."""
        return (self.block_m * self.block_k + self.block_k * self.block_n) * itemsize * self.num_stages


@dataclass(frozen=True)
class Shape:
    """What a config choice depends on. ``mode``: "f16" (bf16 and fp16 alike: both are 2-byte tensor-core
    types), "tf32" (fp32 operands on tensor cores, ``--precision tf32``), "f32" (fp32: ieee FMA, except
    convolutions from sm_80, three TF32 products on the tensor cores: ``tensor_f32``), or "other"
    (fp64/integers: the broadcast-sum fallback)."""

    kind: str  # "matmul" | "conv" | "attention" | "attention_causal" | "reduce"
    mode: str
    m: int  # rows at the size hints (M of one matmul problem; N*OH*OW for conv)
    n: int
    k: int
    batch: int = 1  # independent problems (matmul batch, conv groups): they multiply the tile count

    @property
    def key(self) -> str:
        """The table's key: M bucketed to a power of two (hints vary with dynamic sizes), N and K exact."""
        return f"{self.kind}:{self.mode}:m{bucket(self.m)}:n{self.n}:k{self.k}:b{bucket(self.batch)}"


def bucket(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def dot_mode(dt: DType, options: BuildOptions) -> str:
    if dt in (DType.bf16, DType.f16) or (dt is DType.f32 and options.precision in ("bf16", "fp16")):
        return "f16"
    if dt is DType.f32 and options.precision == "tf32":  # tensor cores on 4-byte operands
        return "tf32"
    return "f32" if dt is DType.f32 else "other"


def tensor_f32(mode: str, sm: int, kind: str) -> bool:
    """Whether fp32 dots run on the tensor cores (as tf32x3, templates/dot.py): convolutions from sm_80 on.
    Measured on the H200 (fp32 zoo): ResNet-50 8.2 -> 2.1 ms, MobileNetV2 1.8 -> 0.8; matmuls with the
    untuned tensor-core tiles lost (ViT-B 10.6 -> 12.0 ms, BERT 6.2 -> 8.4), so they stay on FMA until tuned."""
    return mode == "f32" and sm >= 80 and kind == "conv"


def _pow2_tile(n: int, big: int) -> int:
    return big if n >= big else max(16, bucket(n))


# ---- candidates --------------------------------------------------------------------------------------

_F16 = (  # (bm, bn, bk, warps, stages): Triton's usual Hopper/Ampere winners, largest first
    (128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (64, 256, 64, 4, 4),
    (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (64, 32, 128, 4, 4), (32, 64, 128, 4, 4), (16, 64, 128, 4, 4),
)  # fmt: skip
_TF32 = tuple((bm, bn, 32, w, st) for bm, bn, _, w, st in _F16)  # the same tiles at half the K step: 4-byte operands
_F32 = (
    (128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (64, 128, 32, 4, 3), (64, 64, 32, 4, 3), (32, 64, 32, 4, 3),
    (64, 32, 32, 4, 3), (32, 32, 32, 4, 3),
)  # fmt: skip


def candidates(s: Shape, sm: int) -> list[Config]:
    """The configs worth trying for ``s`` on ``sm``: fitting shared memory, not much larger than the
    problem (a 128-row tile over 16 rows wastes 7/8 of its work), deduplicated, largest first."""
    if s.kind.startswith("attention"):
        return _attention_candidates(s, sm)
    if s.kind == "reduce":
        return _reduce_candidates(s)
    if s.mode == "other" or sm < 80:
        return [_fallback(s, sm)]
    itemsize = 2 if s.mode == "f16" else 4
    x3 = tensor_f32(s.mode, sm, s.kind)
    table = _TF32 if x3 else {"f16": _F16, "tf32": _TF32}.get(s.mode, _F32)
    limit = SMEM.get(sm, 101376) - 4096  # headroom for the epilogue's layout conversion
    out: list[Config] = []
    for bm, bn, bk, w, st in table:
        bm2, bn2, bk2 = min(bm, _pow2_tile(s.m, bm)), min(bn, _pow2_tile(s.n, bn)), min(bk, _pow2_tile(s.k, bk))
        if (s.mode != "f32" or x3) and sm >= 90 and bm2 < 64 and s.m >= 64:
            continue  # below 64 rows no wgmma: only worth it when M itself is that small
        c = Config(bm2, bn2, bk2, w if bm2 * bn2 >= 64 * 64 else 4, st)
        if c.smem(itemsize) <= limit and c not in out:
            out.append(c)
    return out or [_fallback(s, sm)]


def _fallback(s: Shape, sm: int) -> Config:
    """The pre-tuning rule, for types tl.dot cannot take and GPUs older than sm_80."""
    stages = 3 if sm >= 80 else 2
    if s.mode == "other":
        return Config(16, 16, 16, 4, 1)
    if s.mode == "f32" and not tensor_f32(s.mode, sm, s.kind):
        return Config(_pow2_tile(s.m, 64), _pow2_tile(s.n, 64), 32, 4, stages)
    bm, bn = _pow2_tile(s.m, 128), _pow2_tile(s.n, 128)
    return Config(bm, bn, 64 if sm >= 80 and s.mode == "f16" else 32, 8 if bm * bn >= 128 * 128 else 4, stages)


# ---- the heuristic -----------------------------------------------------------------------------------


def _efficiency(c: Config, mode: str, sm: int, kind: str) -> float:
    """Fraction of an SM's peak one CTA of ``c`` reaches on its own (rough; ranks tiles, nothing more)."""
    if mode == "f32" and not tensor_f32(mode, sm, kind):  # FMA: register blocking; 32-64 accumulators a thread is the sweet spot
        per_thread = c.block_m * c.block_n / (c.num_warps * 32)
        return min(0.85, 0.85 * per_thread / 64)
    area = c.block_m * c.block_n
    wgmma = sm >= 90 and c.block_m >= 64 and c.num_warps % 4 == 0
    base = 0.9 if wgmma else 0.75
    return base * min(1.0, (area / (128 * 256)) ** 0.35) * (1.0 if c.block_m >= 64 else 0.7)


def _ctas_per_sm(c: Config, itemsize: int, sm: int) -> int:
    by_smem = max(1, (SMEM.get(sm, 101376) + 1024) // max(1, c.smem(itemsize)))
    by_threads = max(1, 2048 // (c.num_warps * 32))
    by_regs = max(1, 65536 // (c.num_warps * 32 * 128))  # ~128 registers a thread in a dot loop
    return min(by_smem, by_threads, by_regs, 8)


def estimate_ms(c: Config, s: Shape, sm: int, sms: int | None = None) -> float:
    """Modelled time of ``s`` with ``c``: waves of tiles at the tile's efficiency, or the memory floor."""
    sms = sms or SM_COUNT.get(sm, 108)
    tc, fma, hbm = PEAK.get(sm, PEAK[80] if sm < 90 else PEAK[90])
    x3 = tc / 6 if tensor_f32(s.mode, sm, s.kind) else fma
    peak = {"f16": tc, "tf32": tc / 2}.get(s.mode, x3) * 1e12  # flop/s per SM
    itemsize = 2 if s.mode == "f16" else 4
    tiles = math.ceil(s.m / c.block_m) * math.ceil(s.n / c.block_n) * s.batch
    per_sm = math.ceil(tiles / sms)  # tiles the busiest SM runs
    conc = min(per_sm, _ctas_per_sm(c, itemsize, sm))
    tile_flop = 2 * c.block_m * c.block_n * math.ceil(s.k / c.block_k) * c.block_k
    # a lone 4-warp CTA cannot hide its load latency; two on an SM (or 8 warps) can. More do not add
    # throughput: the tensor cores and shared-memory bandwidth are shared, so the tile's reuse sets the rate.
    alone = conc < 2 and c.num_warps < 8
    compute = per_sm * tile_flop / (peak * _efficiency(c, s.mode, sm, s.kind) * (0.75 if alone else 1.0))
    loaded = (s.m * s.k * math.ceil(s.n / c.block_n) + s.k * s.n * math.ceil(s.m / c.block_m)) * itemsize
    unique = (s.m * s.k + s.k * s.n) * s.batch * itemsize + s.m * s.n * s.batch * 4
    busy = min(1.0, min(tiles, sms * conc) / sms)  # a chip with few CTAs cannot pull full bandwidth
    memory = max(unique, loaded / 4) / (hbm * 1e12 * busy)  # L2 serves most of the re-reads
    return 1e3 * (max(compute, memory) + 2e-6 * math.ceil(s.k / c.block_k) / 64)  # + pipeline latency


def heuristic(s: Shape, sm: int, sms: int | None = None) -> Config:
    if s.kind.startswith("attention"):
        return _attention_default(s, sm)
    if s.kind == "reduce":
        return reduce_default(s)
    cands = candidates(s, sm)
    return min(cands, key=lambda c: (round(estimate_ms(c, s, sm, sms), 6), -c.block_m * c.block_n, c))


# ---- attention and reductions ------------------------------------------------------------------------

# (BLOCK_M, BLOCK_N, warps, stages) for 16-bit flash attention: the Triton tutorial's Hopper/Ampere space,
# denser around 64x64, which won most shapes on the H200 (benchmarks/results/h200_tune_table_*)
_ATTN_F16 = ((64, 64, 4, 3), (64, 64, 4, 2), (64, 64, 4, 4), (64, 64, 8, 3), (64, 32, 4, 3), (64, 32, 4, 4),
             (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (32, 32, 4, 3))  # fmt: skip
_ATTN_F32 = ((64, 32, 4, 2), (32, 32, 4, 2), (64, 64, 4, 2), (32, 64, 4, 2), (64, 32, 8, 2))


def _attention_default(s: Shape, sm: int) -> Config:
    stages = 3 if sm >= 80 else 2
    if s.mode == "f32":  # ieee fp32 dots run on FMA units: small tiles
        bm, bn, w, st = (64, 32, 4, 2) if s.k <= 64 else (32, 32, 4, 2)
    elif s.k <= 64 and s.kind == "attention" and s.n <= 128:  # short keys: one block of 128 covers them
        bm, bn, w, st = 128, 128, 8, 2
    elif s.k <= 64:  # 64x64: more programs than 128-row blocks, and the causal diagonal costs less
        bm, bn, w, st = 64, 64, 4, stages
    elif s.k <= 128:
        bm, bn, w, st = 128, 64, 8, stages
    else:
        bm, bn, w, st = 64, 32, 4, 2
    return _attention_fit(Config(bm, bn, s.k, w, st), s)


def _attention_fit(c: Config, s: Shape) -> Config:
    """``c`` clamped to the problem: no tile far past the sequence lengths, BLOCK_N <= BLOCK_M (the causal
    split into full and diagonal key blocks assumes it)."""
    bm = min(c.block_m, max(16, bucket(s.m)))
    bn = min(c.block_n, bm, max(16, bucket(s.n)))
    return Config(bm, bn, s.k, c.num_warps, c.num_stages)


def _attention_candidates(s: Shape, sm: int) -> list[Config]:
    table = _ATTN_F32 if s.mode == "f32" else _ATTN_F16
    itemsize = 4 if s.mode == "f32" else 2
    limit = SMEM.get(sm, 101376) - 4096
    out = [_attention_default(s, sm)]
    for bm, bn, w, st in table:
        c = _attention_fit(Config(bm, bn, s.k, w, st), s)
        if bn > bm or c in out:
            continue
        if (c.block_m + 2 * c.block_n * c.num_stages) * max(16, bucket(s.k)) * itemsize <= limit:
            out.append(c)
    return out


# rows a program x warps for one-pass reductions (block_n, the row block, is fixed by the row length)
_REDUCE = ((1, 2), (1, 4), (1, 8), (1, 16), (2, 4), (2, 8), (4, 4), (4, 8), (8, 4), (16, 4), (64, 4))


def reduce_default(s: Shape) -> Config:
    """The untuned rule: a row a program from 1024 elements up (more programs in flight hide the latency
    better than more rows a program); short rows are packed up to 2048 elements a program while ~128
    programs remain; 8 warps for the longest rows (16 lose to 8 and 4 on the H200: layer-norm 8192x8192
    at 0.089 against 0.071 ms). ``s.n`` is the row block (a power of two)."""
    rows = s.m // 128
    xb = 1 if s.n >= 1024 else max(1, min(1 << max(0, rows.bit_length() - 1), 64, 2048 // s.n))
    n = xb * s.n
    warps = 8 if n >= 8192 else 4 if n >= 256 else 2 if n >= 64 else 1
    return Config(xb, s.n, 1, warps, 1)


def _reduce_candidates(s: Shape) -> list[Config]:
    out = [reduce_default(s)]
    for xb, w in _REDUCE:
        c = Config(xb, s.n, 1, w, 1)
        if xb * s.n <= 16384 and xb <= max(1, s.m // 256) and w * 32 * 4 <= xb * s.n and c not in out:
            out.append(c)
    return out


# ---- the committed tables ----------------------------------------------------------------------------


@functools.cache
def table(sm: int) -> dict[str, Config]:
    """``tables/sm_NN.json``: shape key -> the config tuning picked on that SM (empty when none is committed)."""
    try:
        text = resources.files(__package__).joinpath("tables", f"sm_{sm}.json").read_text()
    except (FileNotFoundError, OSError):
        return {}
    doc = json.loads(text)
    return {key: Config.from_json(row["config"]) for key, row in sorted(doc.get("entries", {}).items())}


def choose(s: Shape, sm: int) -> tuple[Config, str]:
    """The config for ``s`` on ``sm`` without a GPU, and where it came from ("table" or "heuristic")."""
    hit = table(sm).get(s.key)
    if hit is not None:
        return hit, "table"
    return heuristic(s, sm), "heuristic"


def matmul_shape(m: int, n: int, k: int, batch: int, dt: DType, options: BuildOptions) -> Shape:
    return Shape("matmul", dot_mode(dt, options), m, n, k, batch)


def conv_shape(m: int, n: int, k: int, groups: int, dt: DType, options: BuildOptions) -> Shape:
    """A conv as the implicit GEMM it runs: m = N*OH*OW, n = output channels per group, k = cin/g*kh*kw."""
    return Shape("conv", dot_mode(dt, options), m, n, k, groups)

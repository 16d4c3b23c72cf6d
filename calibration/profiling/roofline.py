"""The analytic roofline: step costs from a model shape and a GPU spec, with no GPU at hand.

Every number this module gives is *analytic* (profiles built from it say
``metadata.source = "analytic"``): a roofline estimate, never a measurement. One
forward over ``n`` tokens costs::

    t(n) = max(FLOPs / (G * peak * eff_compute), bytes / (G * bandwidth * eff_memory))
           + step overhead [+ eager overhead above the largest CUDA graph] [+ collectives when G > 1]

with FLOPs from the padded token count (CUDA-graph bucket, then GEMM tile) and
bytes from the weights read once per forward (for MoE: the dense part plus the
expected number of distinct experts the tokens touch). Per-request KV-cache
reads at a reference context length go into the profile's ``per_request``
table, which the simulator adds to ``1 / SPS(B)``. Drafter passes are priced by
:mod:`calibration.profiling.drafter_cost`; :mod:`calibration.profiling.analytic` turns
both into a profile (``python -m calibration.roofline``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from calibration.models.shapes import ModelShape


@dataclass(frozen=True)
class GPUSpec:
    """Vendor peak numbers of one GPU (datasheet values, dense, no sparsity).

    * ``peak_flops_per_s``: dense BF16 tensor-core peak. H100 SXM and H200 SXM both
      list 989 TFLOP/s (NVIDIA H100 / H200 datasheets; the 1979 figure assumes 2:4 sparsity).
    * ``hbm_bytes_per_s``: HBM bandwidth, 3.35 TB/s (H100 SXM, HBM3) and 4.8 TB/s (H200, HBM3e).
    * ``hbm_capacity_bytes``: 80 GB (H100 SXM) and 141 GB (H200).
    * ``interconnect_bytes_per_s``: NVLink 4 is 900 GB/s bidirectional per GPU; 450 GB/s per direction.
    """

    name: str
    peak_flops_per_s: float
    hbm_bytes_per_s: float
    hbm_capacity_bytes: float
    interconnect_bytes_per_s: float


GPUS: dict[str, GPUSpec] = {
    "h100": GPUSpec("H100 SXM", 989e12, 3.35e12, 80e9, 450e9),
    "h200": GPUSpec("H200 SXM", 989e12, 4.8e12, 141e9, 450e9),
}


@dataclass(frozen=True)
class Assumptions:
    """Every constant of the cost model that is not a datasheet number. All are assumptions.

    * ``compute_efficiency`` 0.6: fraction of peak that large bf16 GEMMs of LLM layers
      reach in serving engines (typically 50-70%).
    * ``memory_efficiency`` 0.8: fraction of HBM bandwidth a weight-streaming GEMV/GEMM
      reaches (typically 75-90%).
    * ``step_overhead_s`` 1.5 ms: per target step, non-GEMM time outside the roofline
      (CUDA-graph launch, input preparation, sampling, detokenisation hand-off, Python
      framework) - the order of what decode steps of 8B-class models show in vLLM/SGLang.
    * ``eager_overhead_s`` 1.0 ms: extra per-kernel launch cost when a batch exceeds the
      largest captured CUDA graph and runs eagerly.
    * ``max_graph_tokens`` 1024: largest captured CUDA-graph batch; batches are padded
      up to the next capture size (vLLM-like sizes, see :func:`cuda_graph_sizes`).
    * ``tile_tokens`` 64: GEMM M-tile; compute is paid for tokens padded to a multiple of it.
    * ``context_tokens`` 2048: reference context length for attention FLOPs and KV reads.
    * ``weight_memory_fraction`` 0.7: share of HBM the weights may take (the rest is
      KV cache and activations); decides GPUs per replica.
    * ``collective_latency_per_layer_s`` 20 us: with G > 1 GPUs, two collectives per
      layer (attention all-reduce, MoE dispatch/combine or MLP all-reduce) at ~10 us each
      (NCCL small-message latency over NVLink); their volume adds
      ``2 * tokens * hidden * 2 bytes / interconnect`` per layer.
    * ``draft_pass_overhead_s`` 0.15 ms: launch cost of one drafter forward (graph replay,
      input preparation); ``sequential_step_overhead_s`` 10 us: one fused step of the
      DSpark sequential head (gather, small GEMM, sampling).
    * ``markov_rank`` 256: rank r of the Markov head (DSpark paper, sec. 3.1).
    * ``scheduler_fixed_s`` 0.5 ms: host sync / pipeline bubble a synchronous policy adds;
      ``scheduler_per_candidate_s`` 20 ns: sorting and scanning one (request, position).
    * ``max_batch_tokens`` 8192, ``max_requests`` 1024, ``max_draft_tokens`` 16: extents of
      the tables (not assumptions about the hardware); the simulator errors outside them.
    """

    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    step_overhead_s: float = 1.5e-3
    eager_overhead_s: float = 1.0e-3
    max_graph_tokens: int = 1024
    tile_tokens: int = 64
    context_tokens: int = 2048
    weight_memory_fraction: float = 0.7
    collective_latency_per_layer_s: float = 20e-6
    draft_pass_overhead_s: float = 0.15e-3
    sequential_step_overhead_s: float = 10e-6
    markov_rank: int = 256
    scheduler_fixed_s: float = 0.5e-3
    scheduler_per_candidate_s: float = 20e-9
    max_batch_tokens: int = 8192
    max_requests: int = 1024
    max_draft_tokens: int = 16

    def __post_init__(self) -> None:
        for key in ("compute_efficiency", "memory_efficiency", "weight_memory_fraction"):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise ValueError(f"{key} must be in (0, 1], got {getattr(self, key)}")
        for key in ("max_graph_tokens", "tile_tokens", "context_tokens", "max_batch_tokens", "max_requests",
                    "max_draft_tokens", "markov_rank"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")


def cuda_graph_sizes(max_graph_tokens: int) -> np.ndarray:
    """vLLM-like capture sizes: 1, 2, 4, 8, multiples of 8 to 512, of 16 to 1024, of 32 beyond."""
    sizes = [1, 2, 4, *range(8, 513, 8), *range(528, 1025, 16), *range(1056, max_graph_tokens + 1, 32)]
    sizes = [s for s in sizes if s <= max_graph_tokens]
    if sizes[-1] != max_graph_tokens:
        sizes.append(max_graph_tokens)
    return np.array(sizes, dtype=np.int64)


@dataclass(frozen=True)
class Roofline:
    """Cost model of one replica (``num_gpus`` GPUs) serving ``shape``; all times in seconds."""

    shape: ModelShape
    gpu: GPUSpec
    assume: Assumptions
    num_gpus: int

    # -------------------------------------------------------------- padding
    def graph_tokens(self, tokens: np.ndarray) -> np.ndarray:
        """Batch after CUDA-graph padding (unchanged above the largest graph: eager)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        sizes = cuda_graph_sizes(self.assume.max_graph_tokens)
        idx = np.minimum(np.searchsorted(sizes, tokens), sizes.size - 1)
        return np.where(tokens <= sizes[-1], sizes[idx], tokens)

    def tile_tokens(self, tokens: np.ndarray) -> np.ndarray:
        tile = self.assume.tile_tokens
        return -(-np.asarray(tokens, dtype=np.int64) // tile) * tile

    # ------------------------------------------------------------ primitives
    def roofline_s(self, flops: np.ndarray, bytes_: np.ndarray) -> np.ndarray:
        a, g = self.assume, self.gpu
        compute_s = np.asarray(flops, dtype=np.float64) / (self.num_gpus * g.peak_flops_per_s * a.compute_efficiency)
        memory_s = np.asarray(bytes_, dtype=np.float64) / (self.num_gpus * g.hbm_bytes_per_s * a.memory_efficiency)
        return np.maximum(compute_s, memory_s)

    def expected_experts(self, tokens: np.ndarray) -> np.ndarray:
        """Expected distinct routed experts touched by ``tokens`` tokens in one layer: E(1-(1-k/E)^n)."""
        s = self.shape
        n = np.asarray(tokens, dtype=np.float64)
        if not s.is_moe:
            return np.zeros(n.shape)
        return s.num_experts * (1.0 - (1.0 - s.experts_per_token / s.num_experts) ** n)

    def layer_weight_bytes(self, tokens: np.ndarray, moe: bool) -> np.ndarray:
        """Weight bytes one layer reads for a forward over ``tokens`` tokens."""
        s = self.shape
        if not moe:
            return np.full(np.shape(tokens), float(s.layer_params(False) * s.bytes_per_param))
        dense = s.attention_params + s.router_params + 2 * s.hidden_size + s.num_shared_experts * s.expert_params
        return (dense + self.expected_experts(tokens) * s.expert_params) * s.bytes_per_param

    def attention_flops_per_token(self, context_tokens: float) -> float:
        """QK^T and AV over the context, all layers: 4 * L * Hq * d * context."""
        s = self.shape
        return 4.0 * s.num_layers * s.num_q_heads * s.head_dim * context_tokens

    def collectives_s(self, tokens: np.ndarray, num_layers: int) -> np.ndarray:
        if self.num_gpus == 1:
            return np.zeros(np.shape(tokens))
        volume = 2.0 * np.asarray(tokens, dtype=np.float64) * self.shape.hidden_size * 2
        per_layer = self.assume.collective_latency_per_layer_s + volume / self.gpu.interconnect_bytes_per_s
        return num_layers * per_layer

    # ------------------------------------------------------------ the tables
    def verify_step_s(self, batch_tokens: np.ndarray) -> np.ndarray:
        """1 / SPS(B): one target forward over B batch tokens (KV reads excluded: see per_request_s)."""
        s, a = self.shape, self.assume
        b = np.asarray(batch_tokens, dtype=np.int64)
        if b.size and b.min() < 1:
            raise ValueError(f"batch tokens must be >= 1, got {b.min()}")
        graph = self.graph_tokens(b)
        compute = self.tile_tokens(graph)
        flops = compute * (2.0 * s.matmul_params_per_token + self.attention_flops_per_token(a.context_tokens))
        bytes_ = (s.num_dense_mlp_layers * self.layer_weight_bytes(graph, False)
                  + s.num_moe_layers * self.layer_weight_bytes(graph, True)
                  + s.lm_head_params * s.bytes_per_param)
        eager = np.where(b > a.max_graph_tokens, a.eager_overhead_s, 0.0)
        return (self.roofline_s(flops, bytes_) + a.step_overhead_s + eager
                + self.collectives_s(graph, s.num_layers))

    def per_request_s(self, num_requests: np.ndarray) -> np.ndarray:
        """KV-cache reads of R requests at the reference context: kv bytes * R / (bw * eff)."""
        kv = self.shape.kv_bytes_per_token * self.assume.context_tokens
        return self.roofline_s(0.0, kv * np.asarray(num_requests, dtype=np.float64))

    def prefill(self) -> tuple[float, float]:
        """(fixed_s, tokens_per_s): compute-bound throughput at the reference context (causal: half of it
        attended on average); fixed cost = step overhead + one read of the weights."""
        s, a = self.shape, self.assume
        flops_per_token = 2.0 * s.matmul_params_per_token + self.attention_flops_per_token(a.context_tokens / 2)
        tokens_per_s = self.num_gpus * self.gpu.peak_flops_per_s * a.compute_efficiency / flops_per_token
        fixed_s = a.step_overhead_s + float(self.roofline_s(0.0, s.total_params * s.bytes_per_param))
        return fixed_s, tokens_per_s


def gpus_per_replica(shape: ModelShape, gpu: GPUSpec, assume: Assumptions) -> int:
    """Smallest power of two of GPUs whose weight share of HBM holds the bf16 weights."""
    need = shape.total_params * shape.bytes_per_param / (gpu.hbm_capacity_bytes * assume.weight_memory_fraction)
    return 1 << max(0, math.ceil(math.log2(max(need, 1.0))))


def verify_grid(assume: Assumptions) -> np.ndarray:
    """Batch tokens to tabulate: 1..64 densely, and both sides of every graph-bucket and tile edge.

    Between two consecutive edges a dense model's step time is constant, so linear
    interpolation over this grid reproduces the step function exactly at every integer.
    """
    top = assume.max_batch_tokens
    edges = np.concatenate([cuda_graph_sizes(assume.max_graph_tokens),
                            np.arange(assume.tile_tokens, top + 1, assume.tile_tokens),
                            2 ** np.arange(0, int(math.log2(top)) + 1), [top]])
    points = np.concatenate([np.arange(1, 65), edges - 1, edges, edges + 1])
    return np.unique(points[(points >= 1) & (points <= top)])


def requests_grid(max_requests: int, num_points: int = 24) -> np.ndarray:
    """Log-spaced request counts 1..max_requests (integers, always including both ends)."""
    points = np.unique(np.round(np.geomspace(1, max_requests, num_points)).astype(np.int64))
    return np.union1d(points, [1, max_requests])

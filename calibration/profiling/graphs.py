"""The verifier's dense steps replayed as CUDA graphs (``profile_gpu --cuda-graphs N``): the graph-mode cost and the
cliff above the largest captured size.

Serving engines capture the decode step's forward as CUDA graphs for batch sizes up
to a limit (vLLM: ``max_cudagraph_capture_size``) and run larger steps eagerly, where
every kernel is launched from Python. :func:`graph_call` captures one verify point's
forward (context 0, the dense table's layout) after two warm-up runs on a side
stream, as capture requires, and returns the replay to time. :func:`graph_tables`
turns the eager and the replayed times into the version-2 form:

* ``verify``: the graph-replay time at every B up to the largest captured size N, the
  eager time above it (the simulator reads the eager table there anyway);
* ``cuda_graphs``: ``max_captured_tokens`` N and ``eager`` - the eager steps over the
  whole grid, which replace the verify table above N.

The dense verify table and the attention table's pairs of forwards are captured; chunk,
prefill and drafter tables are eager times. An attention entry is the difference of two
forwards: eagerly, their launch cost cancels on average, but its jitter (milliseconds
on a 36-layer model) does not, and it buried every attention difference of the first
Qwen3-8B profile on an H200 (docs/calibration.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from calibration.profiling.timing import Prepare
from simulator.costs import CudaGraphsBlock


def graph_call(prepare: Prepare) -> Prepare:
    """Sets up ``prepare``'s call captured as a CUDA graph; the call to time is the graph's replay."""
    def prepared() -> object:
        call = prepare()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the capture: lazy initialisation must not be captured
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        return functools.partial(_replay, graph, call)
    return prepared  # type: ignore[return-value]


def _replay(graph: torch.cuda.CUDAGraph, call: Callable[[], object]) -> None:
    """One replay of ``graph``. It takes ``call`` too, only to keep it alive: the graph reads and writes the tensors
    ``call`` holds (its inputs, its cache) at the addresses they had at capture, so they must outlive it."""
    del call
    graph.replay()


def graph_tables(batch_tokens: tuple[int, ...], eager_s: list[float], graph_s: list[float],
                 max_captured_tokens: int) -> tuple[tuple[float, ...], CudaGraphsBlock, dict[str, Any]]:
    """(verify steps_per_s over ``batch_tokens``, the ``cuda_graphs`` block, metadata) from the eager times of every
    B and the graph times of the B up to ``max_captured_tokens`` (in grid order)."""
    captured = [b for b in batch_tokens if b <= max_captured_tokens]
    if len(captured) != len(graph_s):
        raise ValueError(f"{len(graph_s)} graph times for the {len(captured)} batch sizes up to {max_captured_tokens}")
    step_s = [*graph_s, *eager_s[len(graph_s):]]
    block = CudaGraphsBlock(max_captured_tokens, eager_batch_tokens=batch_tokens,
                            eager_steps_per_s=tuple(1.0 / t for t in eager_s))
    saved = [e - g for e, g in zip(eager_s, graph_s, strict=False)]
    meta = {
        "max_captured_tokens": max_captured_tokens,
        "definition": ("verify table up to max_captured_tokens: median replay time of the verifier's forward captured "
                       "as a CUDA graph (torch.cuda.CUDAGraph, context 0, the dense table's layout); above it and in "
                       "cuda_graphs.eager: the same forward run eagerly"),
        "graph_batch_tokens": captured,
        "graph_step_s": graph_s,
        "eager_minus_graph_s": {"min": min(saved), "median": sorted(saved)[len(saved) // 2], "max": max(saved)},
    }
    return tuple(1.0 / t for t in step_s), block, meta


def cuda_graphs_note(device: torch.device, max_captured_tokens: int | None) -> str:
    """What the profile says about CUDA graphs."""
    if device.type != "cuda":
        return f"none: measured on {device.type}, which has no CUDA graphs; no cuda_graphs block, no cliff"
    if max_captured_tokens is None:
        return ("not measured: the verifier ran eagerly (no --cuda-graphs), so the tables are eager costs and no "
                "cuda_graphs block is written")
    return (f"measured: the dense verify table is CUDA-graph replay up to {max_captured_tokens} batch tokens, eager "
            "above (cuda_graphs.eager); the attention table's forwards are replayed too; chunk, prefill and drafter "
            "tables are eager")

"""Which attention path a verification step takes, and what each costs: ``python -m calibration.attention_paths``.

The verifier (:func:`calibration.models.model.attend`) computes every request's attention with one call of
PyTorch's ``scaled_dot_product_attention``: queries ``[R, Hq, Q, d]`` against keys and values ``[R, Hkv, L, d]``
under a boolean mask, grouped-query heads shared through ``enable_gqa``. Which kernel SDPA picks for that call
depends on the shapes, so the cost of verifying Q tokens against a long context need not follow the KV it reads.
This times that call per layer beside three exact rewrites of it:

* ``ours``: the call as the verifier makes it;
* ``keys_pad16``: the key axis padded to a multiple of 16 (padded keys masked out);
* ``gqa_folded``: each KV head's query heads folded into the query axis (``[R, Hkv, G*Q, d]``, no ``enable_gqa``);
* ``folded_pad16``: both.

Each row is at one context C (every request's) and Q query tokens, in milliseconds per request per forward (one
layer's time x layers / R). The rewrites give the same output as ``ours`` up to rounding (the ``max_abs_diff``
columns say how close); the point is the time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from calibration.models.model import attend
from calibration.models.shapes import ModelShape, get_shape
from calibration.profiling.machine import device_name, software
from calibration.profiling.timing import synchronizer

Attention = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def folded(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """``attend`` with each KV head's ``G`` query heads stacked along the query axis: the same softmax rows."""
    r, hq, nq, d = q.shape
    hkv = k.shape[1]
    out = F.scaled_dot_product_attention(q.reshape(r, hkv, hq // hkv * nq, d), k, v,
                                         attn_mask=mask.repeat(1, 1, hq // hkv, 1))
    return out.reshape(r, hq, nq, d)


PATHS: dict[str, tuple[Attention, bool]] = {  # name -> (attention, keys padded to a multiple of 16)
    "ours": (attend, False), "keys_pad16": (attend, True), "gqa_folded": (folded, False),
    "folded_pad16": (folded, True)}


def verification_mask(requests: int, context: int, queries: int, keys: int, device: torch.device) -> Tensor:
    """``[R, 1, Q, keys]``: query i of each request sees its ``context`` cached keys and new tokens 0..i."""
    visible = torch.arange(keys, device=device)[None, :] < context + torch.arange(queries, device=device)[:, None] + 1
    return visible[None, None].expand(requests, 1, queries, keys).contiguous()


def time_s(call: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Mean seconds of ``call`` over ``repeats`` runs after 3 warm-up runs, the device synchronised around them."""
    sync = synchronizer(device)
    for _ in range(3):
        call()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    sync()
    return (time.perf_counter() - start) / repeats


@torch.inference_mode()
def measure_paths(shape: ModelShape, device: torch.device, dtype: torch.dtype, contexts: list[int],
                  queries: list[int], requests: int, repeats: int, seed: int = 0) -> list[dict[str, float]]:
    """One row per (context, query tokens): each path's ms per request per forward and its largest difference
    from ``ours``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    r, hq, hkv, d = requests, shape.num_q_heads, shape.num_kv_heads, shape.head_dim
    rows = []
    for context in contexts:
        for nq in queries:
            keys = context + nq
            padded = -(-keys // 16) * 16
            k, v = (torch.randn(r, hkv, padded, d, generator=gen, device=device, dtype=dtype) for _ in range(2))
            q = torch.randn(r, hq, nq, d, generator=gen, device=device, dtype=dtype)
            masks = {n: verification_mask(r, context, nq, n, device) for n in (keys, padded)}
            row: dict[str, float] = {"context_tokens": context, "query_tokens": nq}
            reference = attend(q, k[:, :, :keys], v[:, :, :keys], masks[keys]).float()
            for name, (path, pad) in PATHS.items():
                n = padded if pad else keys
                args = (q, k[:, :, :n], v[:, :, :n], masks[n])
                row[f"{name}_ms"] = time_s(lambda path=path, args=args: path(*args), device, repeats) \
                    * shape.num_layers / r * 1e3
                row[f"{name}_max_abs_diff"] = float((path(*args).float() - reference).abs().max())
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(prog="python -m calibration.attention_paths", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="qwen3-8b", help="model shape (heads, head size, layers)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--contexts", default="1024,8192,32768", help="comma-separated context tokens")
    parser.add_argument("--queries", default="1,2,3,8,9,17", help="comma-separated query tokens per request")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    try:
        contexts = [int(x) for x in args.contexts.split(",")]
        queries = [int(x) for x in args.queries.split(",")]
    except ValueError as exc:
        parser.error(f"--contexts and --queries take comma-separated integers: {exc}")
    if min(contexts) < 0 or min(queries) < 1 or args.requests < 1 or args.repeats < 1:
        parser.error("contexts must be >= 0; query tokens, --requests and --repeats >= 1")
    shape = get_shape(args.preset)
    rows = measure_paths(shape, device, dtype, contexts, queries, args.requests, args.repeats)
    versions = ", ".join(f"{k} {v}" for k, v in software(device).items() if v is not None)
    print(f"{args.preset} attention, {args.requests} requests, {device_name(device)}, {dtype}, {versions}; "
          f"ms per request per forward ({shape.num_layers} layers)")
    print(f"{'context':>8} {'Q':>3} " + " ".join(f"{name:>13}" for name in PATHS) + "   max |path - ours|")
    for row in rows:
        diff = max(row[f"{name}_max_abs_diff"] for name in PATHS)
        print(f"{row['context_tokens']:>8} {row['query_tokens']:>3} "
              + " ".join(f"{row[f'{name}_ms']:>13.3f}" for name in PATHS) + f"   {diff:.1e}")
    return rows


if __name__ == "__main__":
    main()

"""Flash varlen attention on the CPU: `varlen_attn`, a stand-in for torch.nn.attention.varlen.varlen_attn with the
kernel's behaviour at the rows after the last sequence, which a CUDA-only kernel would otherwise keep from the suite.

The texts attend as per-sequence SDPA does. The rows after `cu_seq_q[-1]` are never written by the kernel: neither
the output there nor the gradients (dq, dk, dv) it hands back for them. Their memory holds whatever it held, here
NaN, the worst case, so that a caller that lets them reach anything learns it on a CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _Unwritten(torch.autograd.Function):
    """Identity on rows < end; NaN at the rows >= end in the forward output (`output=True`) or in the gradient."""

    @staticmethod
    def forward(ctx, tensor, end, output):
        ctx.end, ctx.output = end, output
        return _nan_after(tensor, end) if output else tensor.clone()

    @staticmethod
    def backward(ctx, grad):
        return (grad if ctx.output else _nan_after(grad, ctx.end)), None, None


def _nan_after(tensor: torch.Tensor, end: int) -> torch.Tensor:
    tensor = tensor.clone()
    tensor[end:] = float("nan")
    return tensor


def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, **unused):
    """[tokens, heads, dim] each; the sequences at cu_seq_q (the same for keys: self-attention only)."""
    assert torch.equal(cu_seq_q, cu_seq_k) and not unused, "the stand-in covers self-attention without options"
    bounds = cu_seq_q.tolist()
    end = bounds[-1]
    query, key, value = (_Unwritten.apply(t, end, False) for t in (query, key, value))
    rows = [query.new_zeros(0, *query.shape[1:])]
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        assert stop - start <= max_q, "a sequence longer than max_q: the kernel would cut it"
        one = [t[start:stop].transpose(0, 1) for t in (query, key, value)]
        rows.append(F.scaled_dot_product_attention(*one, scale=scale).transpose(0, 1))
    out = torch.cat([*rows, query.new_zeros(query.shape[0] - end, *query.shape[1:])])
    return _Unwritten.apply(out, end, True)

"""Short probes of the GPU a lease runs on (bench/gpu_lease.py's env stage): the GEMM peak, varlen attention on
packed sequences against padded SDPA, and a whole training step captured as one CUDA graph against eager steps.

Each probe answers one table cell; on a machine without CUDA the CUDA-only ones say so. A probe that raises is a
finding, not a failed lease: its cell names the error.
"""

from __future__ import annotations

import copy
import itertools
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def gemm_tflops(n: int, dtype: torch.dtype, repeats: int = 10) -> float:
    """Dense matrix-product throughput at n x n x n (CUDA when present)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2 * n**3 * repeats / (time.perf_counter() - started) / 1e12


def cuda_ms(fn, repeats: int = 20) -> float:
    """Mean milliseconds of fn() on the GPU (CUDA events, after 3 warm-ups)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def finding(probe):
    """A probe's error as its cell instead of the lease's end."""

    def guarded() -> str:
        if not torch.cuda.is_available():
            return "CUDA only: not run"
        try:
            return probe()
        except Exception as error:  # noqa: BLE001  (any failure of the probed feature is what the cell reports)
            return f"failed: {type(error).__name__}: {str(error)[:200]}".replace("|", "/").replace("\n", " ")

    return guarded


@finding
def varlen_probe() -> str:
    """Packed sequences through torch.nn.attention.varlen.varlen_attn: outputs and gradients against SDPA run per
    sequence, and forward+backward time against SDPA over the same texts padded to the longest (bf16, 12 heads of
    64, the lengths of a batch of 512 AG News texts)."""
    from torch.nn.attention.varlen import varlen_attn

    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, 129, (512,), generator=generator).tolist()
    heads, dim, dtype = 12, 64, torch.bfloat16
    total, longest = sum(lengths), max(lengths)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(total, heads, dim, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    out = varlen_attn(q, k, v, cu, cu, longest, longest)
    out.float().square().sum().backward()
    packed_grad = q.grad.clone()
    q.grad = None
    reference = []
    for a, b in itertools.pairwise(cu[:9].tolist()):  # the first 8 sequences, each alone
        one = [t[a:b].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        reference.append(F.scaled_dot_product_attention(*one)[0].transpose(0, 1))
    reference = torch.cat(reference)
    reference.float().square().sum().backward()
    end = int(cu[8])
    out_error = (out[:end].float() - reference.float()).abs().max().item()
    grad_error = (packed_grad[:end].float() - q.grad[:end].float()).abs().max().item()
    padded = [torch.zeros(len(lengths), heads, longest, dim, device="cuda", dtype=dtype, requires_grad=True)]
    padded *= 3
    mask = torch.arange(longest, device="cuda")[None, :] < torch.tensor(lengths, device="cuda")[:, None]
    mask = mask[:, None, None, :]

    def packed_step():
        varlen_attn(q, k, v, cu, cu, longest, longest).sum().backward()

    def padded_step():
        F.scaled_dot_product_attention(*padded, attn_mask=mask).sum().backward()

    packed_ms, padded_ms = cuda_ms(packed_step), cuda_ms(padded_step)
    return (
        f"max error {out_error:.1e} (output), {grad_error:.1e} (dq) against per-sequence SDPA; forward+backward "
        f"{packed_ms:.2f} ms packed vs {padded_ms:.2f} ms padded to {longest} ({padded_ms / packed_ms:.2f}x), "
        f"{1 - total / (len(lengths) * longest):.0%} padding; {padding_tail(cu, longest)}"
    )


def padding_tail(cu: torch.Tensor, longest: int) -> str:
    """Whether the rows after the last text (a packed row's padding) come back finite from the kernel and from
    training.speed.packing's attention, forward and backward."""
    from torch.nn.attention.varlen import varlen_attn

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the lease runs bench/ scripts uninstalled
    from training.speed.packing import varlen_attention

    end = int(cu[-1])
    q, k, v = (torch.randn(12, end + 1000, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in "qkv")
    raw = varlen_attn(*(t.detach().transpose(0, 1).contiguous() for t in (q, k, v)), cu, cu, longest, longest)
    text_mask = torch.ones(len(cu) - 1, longest, dtype=torch.bool, device="cuda")
    varlen_attention(q, k, v, cu, text_mask, None).float().sum().backward()
    finite = all(bool(t.grad.isfinite().all()) for t in (q, k, v))
    return f"padding rows: kernel's output finite {bool(raw[end:].isfinite().all())}, ours finite {finite} (backward)"


def mlp_step(model, optimizer, x, y):
    """One training step with nothing that waits on the host: loss, backward, clipping, fused AdamW."""
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)  # the graph's gradients stay where it captured them
    return loss


@finding
def step_graph_probe(steps: int = 20) -> str:
    """A whole step (forward, loss, backward, clipping, fused capturable AdamW, zeroing) captured once and replayed
    on new batches copied into its static inputs: parameters against the same steps run eagerly, and time per
    step."""
    torch.manual_seed(0)
    width = 768
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width), torch.nn.Linear(width, 4)
    ).cuda()
    twin = copy.deepcopy(model)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True, capturable=True) for m in (model, twin)]
    batches = [(torch.randn(64, width, device="cuda"), torch.randint(0, 4, (64,), device="cuda")) for _ in range(steps)]
    static_x, static_y = (t.clone() for t in batches[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-ups off the capture stream, as capture requires; the twin takes them too
        for m, optimizer in zip((model, twin), optimizers, strict=True):
            for _ in range(3):
                mlp_step(m, optimizer, static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mlp_step(model, optimizers[0], static_x, static_y)
    for x, y in batches:
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        mlp_step(twin, optimizers[1], x, y)
    error = max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters(), strict=True))
    replay_ms = cuda_ms(graph.replay)
    eager_ms = cuda_ms(lambda: mlp_step(twin, optimizers[1], static_x, static_y))
    return (
        f"max parameter difference {error:.1e} after {steps} steps; {replay_ms:.3f} ms per replay vs "
        f"{eager_ms:.3f} ms eager ({eager_ms / replay_ms:.1f}x)"
    )

"""The machine's ceiling for a served model: the measured peak GEMM rate at the serving precision (torch, or OpenVINO
int8), and a DistilBERT forward pass's FLOPs per text, 2·L·(4·d² + 2·d·f) per layer in its linear layers plus
2·2·L²·d in attention; the ceiling is their ratio in texts/s."""

from __future__ import annotations

import time


def bench_device() -> str:
    """Where the services run: the GPU when there is one (the service's DEVICE=auto does the same)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def peak_gemm_flops(dtype, threads: int, trials: int = 7) -> float:
    """Best of several timed matmul runs (2048² on CPU, 8192² on GPU): a peak, robust to a noisy neighbour."""
    import torch

    torch.set_num_threads(threads)
    device = bench_device()
    n = 8192 if device == "cuda" else 2048
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    for _ in range(2):
        a @ b
    best = 0.0
    for _ in range(trials):
        synchronize()
        start_t = time.perf_counter()
        for _ in range(4):
            a @ b
        synchronize()
        best = max(best, 2 * n**3 * 4 / (time.perf_counter() - start_t))
    return best


def openvino_int8_peak(threads: int, trials: int = 7) -> float:
    """Best of several timed 2048² int8 matrix products in OpenVINO (a linear layer quantized by NNCF, as in the
    served model): the peak of the int8 path ours serves, which torch's CPU int8 GEMM is not."""
    import nncf
    import openvino as ov
    import torch

    n = 2048
    x = torch.randn(n, n)
    layer = torch.nn.Linear(n, n, bias=False).eval()
    quantized = nncf.quantize(ov.convert_model(layer, example_input=x), nncf.Dataset([x.numpy()]), subset_size=1)
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
    request = ov.Core().compile_model(quantized, "CPU", config).create_infer_request()
    for _ in range(2):
        request.infer([x.numpy()])
    best = 0.0
    for _ in range(trials):
        start_t = time.perf_counter()
        for _ in range(4):
            request.infer([x.numpy()])
        best = max(best, 2 * n**3 * 4 / (time.perf_counter() - start_t))
    return best


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def flops_per_text(config, tokens: float) -> float:
    d, f, n = config.dim, config.hidden_dim, config.n_layers
    return n * (2 * tokens * (4 * d * d + 2 * d * f) + 4 * tokens * tokens * d)

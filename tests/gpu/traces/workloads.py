# GPU workload shapes for the recorded job traces (tests/fixtures/gpu-traces/README.md).
#
#   python3 workloads.py SHAPE SECONDS
#
# Each shape keeps GPU 0 in one well-understood state for SECONDS and reports its progress the way
# a training or inference program reports work: cumulative counters (steps, samples, tokens)
# written to $TRACE_WORK_FILE after every step, read once a second by record.py (what an
# OpenTelemetry SDK's periodic exporter would send). The last line printed is the rate reached.
import os
import sys
import time

import torch

WORK_FILE = os.environ.get("TRACE_WORK_FILE")


class Work:
    """Cumulative work counters, published atomically to WORK_FILE."""

    def __init__(self):
        self.steps = 0
        self.samples = 0
        self.tokens = 0
        self._last = 0.0

    def add(self, steps=1, samples=0, tokens=0, force=False):
        self.steps += steps
        self.samples += samples
        self.tokens += tokens
        now = time.time()
        if WORK_FILE and (force or now - self._last >= 0.2):
            self._last = now
            tmp = WORK_FILE + ".tmp"
            with open(tmp, "w") as f:
                f.write(f"{time.time_ns()} {self.steps} {self.samples} {self.tokens}\n")
            os.replace(tmp, WORK_FILE)


def until(secs):
    end = time.time() + secs
    return lambda: time.time() < end


def tensor_bf16(secs, w):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    go = until(secs)
    while go():
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        w.add(steps=10)
    return f"{2 * 8192**3 * w.steps / secs / 1e12:.0f} TFLOP/s bf16"


def fp32_no_tf32(secs, w):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float32)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float32)
    go = until(secs)
    while go():
        for _ in range(4):
            a @ b
        torch.cuda.synchronize()
        w.add(steps=4)
    return f"{2 * 8192**3 * w.steps / secs / 1e12:.1f} TFLOP/s fp32 (TF32 off)"


def fp64_matmul(secs, w):
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float64)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float64)
    go = until(secs)
    while go():
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        w.add(steps=10)
    return f"{2 * 4096**3 * w.steps / secs / 1e12:.1f} TFLOP/s fp64"


def fp16_pipe(secs, w):
    """Half-precision FMAs in registers: the FP16 pipe busy, no tensor cores, little DRAM."""
    import triton
    import triton.language as tl

    @triton.jit
    def fma_loop(x_ptr, iters, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs)
        y = x + 0.5
        a = (x * 0.0 + 0.999).to(tl.float16)
        b = (x * 0.0 + 0.001).to(tl.float16)
        for _ in range(iters):
            x = x * a + b
            y = y * a + b
        tl.store(x_ptr + offs, x + y)

    n = 132 * 2048 * 64
    x = torch.rand(n, device="cuda", dtype=torch.float16)
    go = until(secs)
    while go():
        fma_loop[(n // 1024,)](x, 20000, BLOCK=1024)
        torch.cuda.synchronize()
        w.add()
    return f"{w.steps} kernels of {n} x 2 x 20000 half FMAs"


def d2d_copy(secs, w):
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    go = until(secs)
    while go():
        for _ in range(10):
            dst.copy_(src)
        torch.cuda.synchronize()
        w.add(steps=10)
    return f"{2 * 2 * w.steps / secs:.0f} GB/s read+write (device to device)"


def h2d_pageable(secs, w):
    src = torch.ones(256 << 20, dtype=torch.uint8)  # pageable host memory
    dst = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    go = until(secs)
    while go():
        dst.copy_(src)
        torch.cuda.synchronize()
        w.add()
    return f"{0.25 * w.steps / secs * 1.074:.1f} GB/s host to device (pageable)"


def tiny_sync(secs, w):
    x = torch.ones(1024, device="cuda")
    go = until(secs)
    while go():
        for _ in range(100):
            x.add_(1.0)
            torch.cuda.synchronize()
        w.add(steps=100)
    return f"{w.steps / secs:.0f} tiny synchronous kernels/s"


def input_starved(secs, w):
    """Matmul bursts waiting on a slow single-threaded input pipeline (decode + augment on CPU)."""
    import numpy as np

    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    act = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    wts = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    go = until(secs)
    while go():
        raw = rng.integers(0, 255, size=(32, 3, 224, 224), dtype=np.uint8)
        batch = np.sort(raw.astype(np.float32), axis=-1)  # the "augmentation"
        scale = torch.from_numpy(batch).cuda().mean().to(torch.bfloat16)
        inp = act * scale
        for _ in range(48):
            inp @ wts
        torch.cuda.synchronize()
        w.add(samples=32)
    return f"{w.samples / secs:.0f} samples/s (input-starved)"


def idle_hold(secs, w):
    held = torch.empty(20 << 30, dtype=torch.uint8, device="cuda")
    held.fill_(1)
    torch.cuda.synchronize()
    time.sleep(secs)
    return f"held {held.numel() >> 30} GiB idle"


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=32000, d=768, layers=6, heads=12):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True, norm_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.enc(self.emb(tokens)))


class Synthetic(torch.utils.data.Dataset):
    """Text-like samples whose preparation costs CPU time, as tokenisation and packing do."""

    def __init__(self, seq=256, n=10**7):
        self.seq, self.n = seq, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import numpy as np

        rng = np.random.default_rng(i)
        text = rng.integers(0, 32000, size=self.seq * 64)
        for _ in range(16):  # the CPU work of a tokenizer: a few passes over the text
            text = np.sort(text) ^ (text >> 3)
        return torch.from_numpy((text[: self.seq + 1] % 32000).astype(np.int64))


def train(secs, w, workers):
    torch.backends.cuda.matmul.allow_tf32 = True
    model = TinyLM().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    loader = torch.utils.data.DataLoader(
        Synthetic(), batch_size=32, num_workers=workers, pin_memory=True,
        prefetch_factor=4 if workers else None, persistent_workers=bool(workers))
    go = until(secs)
    for batch in loader:
        if not go():
            break
        batch = batch.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        w.add(samples=batch.shape[0], tokens=batch.shape[0] * (batch.shape[1] - 1))
    return f"{w.samples / secs:.1f} samples/s, {w.tokens / secs:.0f} tokens/s ({workers} loader workers)"


def infer(secs, w, batch):
    model = TinyLM().cuda().eval().to(torch.bfloat16)
    tokens = torch.randint(0, 32000, (batch, 128), device="cuda")
    go = until(secs)
    with torch.inference_mode():
        while go():
            model(tokens).argmax(-1)
            torch.cuda.synchronize()
            w.add(samples=batch, tokens=batch * 128)
    return f"{w.samples / secs:.1f} samples/s at batch {batch}"


SHAPES = {
    "tensor_bf16": tensor_bf16,
    "fp32_no_tf32": fp32_no_tf32,
    "fp64_matmul": fp64_matmul,
    "fp16_pipe": fp16_pipe,
    "d2d_copy": d2d_copy,
    "h2d_pageable": h2d_pageable,
    "tiny_sync": tiny_sync,
    "input_starved": input_starved,
    "idle_hold": idle_hold,
    "train_workers0": lambda s, w: train(s, w, 0),
    "train_workers8": lambda s, w: train(s, w, 8),
    "infer_batch1": lambda s, w: infer(s, w, 1),
    "infer_batch64": lambda s, w: infer(s, w, 64),
}

if __name__ == "__main__":
    shape, secs = sys.argv[1], float(sys.argv[2])
    work = Work()
    rate = SHAPES[shape](secs, work)
    work.add(steps=0, force=True)
    print(f"{shape}: {rate}", flush=True)

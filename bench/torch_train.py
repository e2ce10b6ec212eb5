#!/usr/bin/env python3
"""PyTorch side of bench/bench_train.cpp: one full fp32 training step per model.

Design: the same models, shapes and step as bench_train.cpp, written with torch.nn so that
scripts/bench-vs-torch can put the two rates side by side. A step is forward,
cross_entropy, zero_grad(set_to_none=True) (ampgrad's zero_grad drops gradients too),
backward, AdamW step (lr 1e-3, weight_decay 0.01, torch's default implementation), on
fixed random data made once outside the timing. Each model gets `--warmup` untimed steps,
then `--repeats` timed runs of at least `--min-time` seconds each; the median rate is
reported. Threads: torch.set_num_threads(--threads). Prints one JSON object on stdout,
{model: samples_per_s} (tokens/s for gpt); version, threads and BLAS go to stderr.
Runs on torch 1.13 (Debian's python3-torch) and newer; needs nothing but torch.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

IMAGE_BATCH = 128
GPT_BATCH = 32
GPT = dict(vocab_size=96, block_size=64, layers=2, heads=4, width=128)


def make_mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def make_cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


class CausalSelfAttention(nn.Module):
    # As ampgrad's: qkv Linear(C, 3C), split into heads, masked softmax, proj Linear(C, C).
    def __init__(self, width, heads, block_size):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool)))

    def forward(self, x):
        B, T, C = x.shape
        H, D = self.heads, C // self.heads
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    # Pre-norm: x + attn(ln1(x)), then x + mlp(ln2(x)) with a GELU MLP of width 4C.
    def __init__(self, width, heads, block_size):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, block_size)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTModel(nn.Module):
    def __init__(self, vocab_size, block_size, layers, heads, width):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, width)
        self.pos = nn.Embedding(block_size, width)
        self.blocks = nn.Sequential(*[Block(width, heads, block_size) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        return self.head(self.ln_f(self.blocks(h)))


def make_case(name):
    """(model, step function, items per step)."""
    torch.manual_seed(0)
    if name in ("mlp", "cnn"):
        model = make_mlp() if name == "mlp" else make_cnn()
        x = torch.randn(IMAGE_BATCH, 1, 28, 28)
        y = torch.randint(0, 10, (IMAGE_BATCH,))
        forward_loss = lambda: F.cross_entropy(model(x), y)
        items = IMAGE_BATCH
    elif name == "gpt":
        model = GPTModel(**GPT)
        V, T = GPT["vocab_size"], GPT["block_size"]
        idx = torch.randint(0, V, (GPT_BATCH, T))
        target = torch.randint(0, V, (GPT_BATCH, T))
        forward_loss = lambda: F.cross_entropy(model(idx).view(-1, V), target.view(-1))
        items = GPT_BATCH * T
    else:
        raise SystemExit(f"torch_train.py: unknown model {name!r} (mlp, cnn, gpt)")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    def step():
        loss = forward_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step, items


def measure(step, items, warmup, min_time, repeats):
    for _ in range(warmup):
        step()
    rates = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            step()
            n += 1
            el = time.perf_counter() - t0
            if el >= min_time:
                break
        rates.append(n * items / el)
    return statistics.median(rates)


def blas_info():
    """Which BLAS torch's Linear layers call: BLAS_INFO from the build, and the libblas /
    openblas / mkl library mapped into this process after a matmul (Debian's python3-torch
    uses whatever libblas.so.3 points to: the netlib reference BLAS unless OpenBLAS/BLIS is
    installed, which makes Linear layers far slower than a pip wheel with MKL)."""
    m = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    info = m.group(1) if m else "?"
    torch.ones(64, 64) @ torch.ones(64, 64)
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if re.search(r"(blas|blis|mkl_rt|libmkl)", os.path.basename(path)):
                    libs.add(os.path.realpath(path))
    except OSError:
        pass
    if libs:
        info += " (" + ", ".join(sorted(libs)) + ")"
    if any(l.endswith("/blas/libblas.so.3") or "/blas/libblas.so" in l for l in libs):
        info += " = reference BLAS, slow"
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: leave torch's)")
    ap.add_argument("--models", default="mlp,cnn,gpt", help="comma-separated subset of mlp,cnn,gpt")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per model")
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per timed run")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per model (median reported)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, BLAS {blas_info()}", file=sys.stderr)
    out = {}
    with torch.enable_grad():
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            step, items = make_case(name)
            out[name] = measure(step, items, args.warmup, args.min_time, max(1, args.repeats))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

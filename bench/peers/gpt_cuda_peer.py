#!/usr/bin/env python3
"""PyTorch's side of bench_cuda's gpt2_step rows: the same GPT-2-small-shaped model as
ampgrad's nn::GPT (pre-LayerNorm blocks, qkv and projection with bias, 4x MLP with erf GELU,
learned positions, untied head without bias, no dropout), written as a PyTorch user writes
it today: F.scaled_dot_product_attention(is_causal=True), default AdamW,
zero_grad(set_to_none=True); fp32, fp16 autocast with GradScaler, and bf16 autocast.
Batch 8, context 1024, vocab 50304, synthetic tokens; tokens/s from CUDA events, median of 5
steps after 3 warm-up steps. Run by scripts/gpu-check on the GPU machine."""
import argparse
import json
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F

V, T, L, H, E, B = 50304, 1024, 12, 12, 768, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(E), nn.LayerNorm(E)
        self.qkv, self.proj = nn.Linear(E, 3 * E), nn.Linear(E, E)
        self.mlp = nn.Sequential(nn.Linear(E, 4 * E), nn.GELU(), nn.Linear(4 * E, E))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, 2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, E), nn.Embedding(T, E)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln_f, self.head = nn.LayerNorm(E), nn.Linear(E, V, bias=False)

    def forward(self, idx):
        h = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.ln_f(h))


def run(precision):
    torch.manual_seed(0)
    model = GPT().cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    dtype = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    idx = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(model(idx).view(B * T, V), tgt.view(B * T))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(3):
        step()
    times = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return B * T / statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = {}
    for p in ("32-true", "16-mixed", "bf16-mixed"):
        rows[p] = run(p)
        print(f"pytorch gpt2_step/{p}: {rows[p]:,.0f} tokens/s")
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "tokens_per_s": rows}, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch side of bench/bench_train.cpp and bench/bench_autocast.cpp: one full training step per model.

Design: the same models, shapes and step as bench_train.cpp (mlp, cnn, gpt) and
bench_autocast.cpp's amp_step (mlp1024), written with torch.nn so that scripts/bench-vs-torch
and scripts/bench-amp-vs-peers can put the rates side by side. A step is forward,
cross_entropy, zero_grad(set_to_none=True) (ampgrad's zero_grad drops gradients too),
backward, AdamW step (lr 1e-3, weight_decay 0.01, torch's default implementation), on
fixed random data made once outside the timing. Each model gets `--warmup` untimed steps,
then `--repeats` timed runs of at least `--min-time` seconds each; the median rate is
reported. Threads: torch.set_num_threads(--threads). Prints one JSON object on stdout,
{model: samples_per_s} (tokens/s for gpt); version, threads and BLAS go to stderr (a line
starting "torch "), then the runner and precision (a line starting "runner: ").

Models: mlp (784-512-256-10) and cnn on [128, 1, 28, 28], gpt on 32 x 64 tokens,
gpt_w256 (4 layers, 4 heads, width 256, context 128) on 16 x 128 tokens, gpt_nanogpt
(6 layers, 6 heads, width 384, context 256) on 8 x 256 tokens (the default set;
attention is F.scaled_dot_product_attention(is_causal=True) where torch has it), and mlp1024 (784-1024-1024-10, batch 256, input [256, 784]; ask for
it with --models).
--precision 32-true (default: plain float32, the old behaviour) or bf16-mixed (CPU
autocast: forward and loss under torch.autocast("cpu", dtype=torch.bfloat16); zero_grad,
backward and the optimizer step outside it, parameters and AdamW state float32).
--runner torch (default: the loop above) or fabric: the same loop through Lightning Fabric,
Fabric(accelerator="cpu", devices=1, precision=--precision), fabric.launch(),
model, opt = fabric.setup(model, opt), fabric.backward(loss); Fabric autocasts the model's
forward itself (and returns its output as float32) and the loss is computed outside that,
as a Fabric user writes it. Imports lightning.fabric (`pip install lightning`) or
lightning_fabric (`pip install lightning-fabric`), whichever is there; see
scripts/install-bench-peers for a Fabric that works with Debian's torch 1.13.
--matmul-precision highest (default), high or medium: torch.set_float32_matmul_precision
(medium: bfloat16 products through oneDNN where the CPU has them; bench_train's
train_step_medium rows are ours).
--compile: the torch runner's model through torch.compile (default backend, inductor) before
the optimizer is made; the warm-up steps' extra time over as many steady steps is the
compile time, reported apart from the rate (measured after the warm-up, compiled).
--detail: print {model: {"rates": [every timed run's rate], "median": rate, "compile_s":
seconds or null, "first_step_s": seconds}} instead of {model: rate} (scripts/bench-report).
--check: only import what --runner needs, print the versions on stderr and exit (status 2,
with the reason on stderr, when the runner cannot be used).
Runs on torch 1.13 (Debian's python3-torch) and newer; the torch runner needs nothing but torch.
"""
import argparse
import importlib
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
MLP1024_BATCH = 256
GPT_BATCH = 32
GPT = dict(vocab_size=96, block_size=64, layers=2, heads=4, width=128)
# bench_train's gpt_w256: the GPT of the first float32 measurement against PyTorch 2.15.
GPT_W256_BATCH = 16
GPT_W256 = dict(vocab_size=96, block_size=128, layers=4, heads=4, width=256)
# nn::gpt_preset("nanogpt"): nanoGPT's Shakespeare character model.
NANOGPT_BATCH = 8
NANOGPT = dict(vocab_size=96, block_size=256, layers=6, heads=6, width=384)
GPT_CASES = {"gpt": (GPT, GPT_BATCH), "gpt_w256": (GPT_W256, GPT_W256_BATCH), "gpt_nanogpt": (NANOGPT, NANOGPT_BATCH)}
# torch >= 2.0 has the fused attention a PyTorch user calls today; torch 1.13 gets the
# masked softmax.
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def make_mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def make_mlp1024():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


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
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
            y = att @ v
        y = y.transpose(1, 2).reshape(B, T, C)
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


def import_fabric():
    """(Fabric class, "module version"), from lightning.fabric or lightning_fabric; raises
    RuntimeError naming why neither can be used."""
    why = []
    for module in ("lightning.fabric", "lightning_fabric"):
        try:
            mod = importlib.import_module(module)
            Fabric = mod.Fabric
        except ModuleNotFoundError as e:
            why.append(f"{module}: {e}")
            continue
        except Exception as e:  # installed, but breaks on this torch
            why.append(f"{module}: {type(e).__name__}: {e}")
            continue
        version = getattr(mod, "__version__", None) or getattr(sys.modules.get(module.split(".")[0]), "__version__", "?")
        return Fabric, f"{module} {version}"
    raise RuntimeError("Lightning Fabric cannot be used (" + "; ".join(why) + "); install it with "
                       "scripts/install-bench-peers and put build/bench-peers on PYTHONPATH, or "
                       "`pip install lightning` where torch comes from pip")


def make_case(name, precision="32-true", fabric=None, compile_model=False):
    """(step function, items per step). fabric: a Fabric object to run the step through, or
    None; compile_model: the model through torch.compile (not with fabric)."""
    torch.manual_seed(0)
    if name in ("mlp", "cnn"):
        model = make_mlp() if name == "mlp" else make_cnn()
        x = torch.randn(IMAGE_BATCH, 1, 28, 28)
        y = torch.randint(0, 10, (IMAGE_BATCH,))
        forward_loss = lambda: F.cross_entropy(model(x), y)
        items = IMAGE_BATCH
    elif name == "mlp1024":
        model = make_mlp1024()
        x = torch.randn(MLP1024_BATCH, 784)
        y = torch.randint(0, 10, (MLP1024_BATCH,))
        forward_loss = lambda: F.cross_entropy(model(x), y)
        items = MLP1024_BATCH
    elif name in GPT_CASES:
        config, batch = GPT_CASES[name]
        model = GPTModel(**config)
        V, T = config["vocab_size"], config["block_size"]
        idx = torch.randint(0, V, (batch, T))
        target = torch.randint(0, V, (batch, T))
        forward_loss = lambda: F.cross_entropy(model(idx).view(-1, V), target.view(-1))
        items = batch * T
    else:
        raise SystemExit(f"torch_train.py: unknown model {name!r} (mlp, cnn, gpt, gpt_w256, gpt_nanogpt, mlp1024)")
    model.train()
    if compile_model:
        # The lambdas above look `model` up when called, so they run the compiled module; its
        # parameters are the original module's, which the optimizer updates.
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    if fabric is not None:
        # The lambdas above look `model` up when called, so they run the wrapped module,
        # whose forward Fabric puts under its precision's autocast.
        model, opt = fabric.setup(model, opt)

        def step():
            loss = forward_loss()
            opt.zero_grad(set_to_none=True)
            fabric.backward(loss)
            opt.step()
            return loss
    elif precision == "bf16-mixed":
        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = forward_loss()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss
    else:
        def step():
            loss = forward_loss()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss

    return step, items


def measure(step, items, warmup, min_time, repeats, detail=None):
    """The median rate over `repeats` timed runs; with a dict `detail`, also fills in
    "rates" (every run's), "first_step_s" and "compile_s" (where the model is compiled: the
    warm-up steps' time over as many steady steps', which counts a recompilation in a later
    warm-up step too; else None)."""
    first, t0 = None, time.perf_counter()
    for i in range(warmup):
        step()
        if i == 0:
            first = time.perf_counter() - t0
    warm = time.perf_counter() - t0
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
    if detail is not None:
        steady = items / statistics.median(rates)
        detail.update(rates=rates, median=statistics.median(rates), first_step_s=first,
                      compile_s=max(0.0, warm - warmup * steady) if detail.get("compiled") and warmup else None)
        detail.pop("compiled", None)
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


def setup_runner(args, prog):
    """Sets torch's threads (args.threads) and, for args.runner == "fabric", launches a
    Fabric(accelerator="cpu", devices=1, precision=args.precision); prints the "torch " and
    "runner: " lines on stderr. Returns (runner name, fabric or None), or None after printing
    why on stderr when Fabric cannot be imported. Shared with bench/torch_trainer.py."""
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    runner, fabric = "torch", None
    if args.runner == "fabric":
        try:
            Fabric, runner = import_fabric()
        except RuntimeError as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return None
        fabric = Fabric(accelerator="cpu", devices=1, precision=args.precision)
        fabric.launch()
        if args.threads > 0:  # the same thread count as the torch runner, whatever Fabric did
            torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, BLAS {blas_info()}", file=sys.stderr)
    print(f"runner: {runner}, precision {args.precision}", file=sys.stderr)
    return runner, fabric


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: leave torch's)")
    ap.add_argument("--models", default="mlp,cnn,gpt,gpt_w256,gpt_nanogpt",
                    help="comma-separated subset of mlp,cnn,gpt,gpt_w256,gpt_nanogpt,mlp1024")
    ap.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true",
                    help="32-true: float32 (default); bf16-mixed: CPU bfloat16 autocast for forward and loss")
    ap.add_argument("--runner", choices=("torch", "fabric"), default="torch",
                    help="torch: a plain loop (default); fabric: the same loop through Lightning Fabric")
    ap.add_argument("--matmul-precision", choices=("highest", "high", "medium"), default="highest",
                    help="torch.set_float32_matmul_precision (bench_train's train_step_medium rows: medium)")
    ap.add_argument("--compile", action="store_true", help="torch runner: the model through torch.compile")
    ap.add_argument("--detail", action="store_true",
                    help="print every run's rate and the compile time per model, not only the median")
    ap.add_argument("--check", action="store_true", help="only check that --runner can be used, then exit")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per model")
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per timed run")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per model (median reported)")
    args = ap.parse_args()
    setup = setup_runner(args, "torch_train.py")
    if setup is None:
        return 2
    runner, fabric = setup
    if args.compile and (fabric is not None or not hasattr(torch, "compile")):
        print("torch_train.py: --compile needs the torch runner and torch >= 2.0", file=sys.stderr)
        return 2
    if args.check:
        return 0
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision(args.matmul_precision)
    elif args.matmul_precision != "highest":
        print("torch_train.py: this torch has no set_float32_matmul_precision", file=sys.stderr)
        return 2
    out = {}
    with torch.enable_grad():
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            step, items = make_case(name, args.precision, fabric, args.compile)
            detail = {"compiled": args.compile} if args.detail else None
            rate = measure(step, items, args.warmup, args.min_time, max(1, args.repeats), detail)
            out[name] = detail if args.detail else rate
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

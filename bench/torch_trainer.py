#!/usr/bin/env python3
"""PyTorch side of examples/ampgrad_train.cpp (ampgrad-train): the same end-to-end Fashion-MNIST training run.

Design: the work of `ampgrad-train --model mlp|cnn` written as a PyTorch user writes it today,
so that scripts/bench-vs-torch can put the two epoch rates side by side. Where bench/torch_train.py
times one step on fixed random data, this times whole epochs on the real data set, the data
loader, shuffling, the scheduler and the per-step loss.item() included.

What matches ampgrad-train, and why:
- Data: Fashion-MNIST's four idx .gz files from --data (default /usr/share/datasets/fashion-mnist,
  ampgrad's kFashionMnistDir), parsed with gzip + torch.frombuffer and normalised as nn/src/datasets.cpp
  does, (x / 255 - 0.2860) / 0.3530, computed in float32 in ampgrad's form
  x * (1 / (255 * 0.3530)) - 0.2860 / 0.3530, images [N, 1, 28, 28] float32, labels int64.
  Loaded once before any timing (ampgrad loads before its timer too).
- Models: mlp (Flatten, 784-512-256-10 with ReLU) and cnn, nn::make_mlp / nn::make_cnn, imported
  from bench/torch_train.py (make_mlp, make_cnn) so the two PyTorch scripts cannot drift apart.
- Optimiser: AdamW(lr=--lr, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01: ampgrad's
  AdamWOptions defaults), torch's default implementation; CosineAnnealingLR(T_max =
  steps_per_epoch * epochs, eta_min 0) stepped after every optimizer step, as ampgrad's
  CosineAnnealing({.t_max = steps_per_epoch * epochs}) through lite.setup_scheduler.
- Loop per epoch: model.train(); for each batch of a DataLoader(TensorDataset(x, y),
  batch_size=--batch-size, shuffle=True, drop_last=False, num_workers=0): loss =
  F.cross_entropy(model(x), y); opt.zero_grad(set_to_none=True) (ampgrad's zero_grad drops
  gradients too); loss.backward(); opt.step(); sched.step(); then loss.item() (ampgrad reads the
  loss after the step too), summed for the epoch's mean train loss. A non-finite loss stops the
  run with status 1, as ampgrad-train does without a loss scale.
- Timing: an epoch's seconds cover only that loop (ampgrad's t0 .. train_time); samples_per_s is
  the epoch's samples over them, mean_rate is all samples over all train seconds. Then the test
  accuracy on the 10,000 test images, in eval mode under torch.no_grad, batches of 1000, in the
  training precision (ampgrad evaluates through the wrapped module), not timed.
- --precision 32-true (default) or bf16-mixed: for the torch runner, forward and loss under
  torch.autocast("cpu", dtype=torch.bfloat16) (autocast runs cross_entropy in float32, as
  ampgrad's loss on its float32-converted output); zero_grad, backward and step outside it,
  parameters and AdamW state float32.
- --runner torch (default) or fabric: the same loop through Lightning Fabric, as torch_train.py's
  fabric runner: Fabric(accelerator="cpu", devices=1, precision=--precision), fabric.launch(),
  model, opt = fabric.setup(model, opt), loader = fabric.setup_dataloaders(loader),
  fabric.backward(loss); Fabric autocasts the model's forward and returns float32, and the loss
  is computed outside that, as ampgrad's Lite does. Exit status 2, with the reason on stderr,
  when Fabric cannot be imported (lightning.fabric or lightning_fabric).
- Seed: torch.manual_seed(--seed) before the model is built (initialisation and shuffling).
- Threads: torch.set_num_threads(--threads) (0: leave torch's), set again after fabric.launch().

Output: --json PATH gets the --json fields of ampgrad-train that the peer comparison reads
(not its per-epoch "steps" and "lr"), {"model", "precision", "epochs":
[{"epoch", "train_loss", "seconds", "samples_per_s", "test_accuracy"}, ...],
"best_test_accuracy", "mean_rate"}; stderr gets a line starting "torch " (version, threads,
BLAS, as torch_train.py), the runner and precision, one line per epoch and a summary.

Known differences, not matched: the DataLoader is made once before the epochs (as a PyTorch
user does; ampgrad-train makes its loader per epoch, inside the timed loop, which costs
nothing measurable); ampgrad's loader gathers the next batch on a background thread
(DataLoaderOptions::prefetch), torch's with num_workers=0 gathers it in the loop; the two
libraries' random streams differ, so initialisation and batch order differ (same distributions).
"""
import argparse
import gzip
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

# bench/torch_train.py, next to this file (its directory is sys.path[0] when run as a script).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import make_cnn, make_mlp, setup_runner  # noqa: E402

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # nn/src/datasets.cpp: the training images' mean and std
TEST_BATCH = 1000


def read_idx(path):
    """A uint8 idx(.gz) file (Fashion-MNIST's images and labels) as a uint8 tensor."""
    with gzip.open(path, "rb") as f:
        data = bytearray(f.read())  # writable, so torch.frombuffer does not warn
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise SystemExit(f"torch_trainer.py: {path} is not a uint8 idx file")
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    if len(data) != offset + math.prod(shape):
        raise SystemExit(f"torch_trainer.py: {path}: {len(data)} bytes do not fit the shape {shape}")
    return torch.frombuffer(data, dtype=torch.uint8, count=math.prod(shape), offset=offset).view(shape)


def fashion_mnist(train, root):
    """(images [N, 1, 28, 28] float32 normalised as ampgrad's, labels [N] int64)."""
    split = "train" if train else "t10k"
    images = os.path.join(root, f"{split}-images-idx3-ubyte.gz")
    labels = os.path.join(root, f"{split}-labels-idx1-ubyte.gz")
    for p in (images, labels):
        if not os.path.exists(p):
            raise SystemExit(f"torch_trainer.py: {p} not found (Debian's package: apt-get install "
                             "dataset-fashion-mnist)")
    x, y = read_idx(images), read_idx(labels)
    if x.dim() != 3 or tuple(x.shape[1:]) != (28, 28) or tuple(y.shape) != (x.shape[0],):
        raise SystemExit(f"torch_trainer.py: unexpected shapes {tuple(x.shape)} and {tuple(y.shape)} in {root}")
    if int(y.max()) > 9:
        raise SystemExit(f"torch_trainer.py: {labels}: a label is out of range (the 10 classes are 0 to 9)")
    # ampgrad's arithmetic, in float32 (the scalars rounded to float32 as there):
    # x * (1 / (255 std)) - mean / std.
    xf = x.to(torch.float32) * (1.0 / (255.0 * STD)) - MEAN / STD
    return xf.view(-1, 1, 28, 28), y.to(torch.int64)


def accuracy(model, x, y, autocast):
    """Test accuracy in eval mode, no grad, batches of TEST_BATCH; autocast: bf16 for the torch
    runner's bf16-mixed (Fabric's wrapped model autocasts itself)."""
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        for i in range(0, x.shape[0], TEST_BATCH):
            correct += (model(x[i:i + TEST_BATCH]).argmax(1) == y[i:i + TEST_BATCH]).sum().item()
    model.train()
    return correct / x.shape[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp", help="mlp (default) or cnn")
    ap.add_argument("--epochs", type=int, default=5, help="epochs to train (default 5)")
    ap.add_argument("--batch-size", type=int, default=128, help="samples per batch (default 128)")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed (default 0)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: leave torch's)")
    ap.add_argument("--data", default=FASHION_MNIST_DIR, help=f"Fashion-MNIST directory (default {FASHION_MNIST_DIR})")
    ap.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true",
                    help="32-true: float32 (default); bf16-mixed: CPU bfloat16 autocast for forward and loss")
    ap.add_argument("--runner", choices=("torch", "fabric"), default="torch",
                    help="torch: a plain loop (default); fabric: the same loop through Lightning Fabric")
    ap.add_argument("--json", help="write per-epoch figures to this file (ampgrad-train's --json fields)")
    args = ap.parse_args()
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        ap.error("--epochs and --batch-size must be positive, --lr above 0")

    setup = setup_runner(args, "torch_trainer.py")
    if setup is None:
        return 2
    runner, fabric = setup

    # ---- data and model (before any timing) ----
    x_train, y_train = fashion_mnist(True, args.data)
    x_test, y_test = fashion_mnist(False, args.data)
    torch.manual_seed(args.seed)
    model = make_mlp() if args.model == "mlp" else make_cnn()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=args.batch_size, shuffle=True, num_workers=0)
    steps_per_epoch = len(loader)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, steps_per_epoch * args.epochs))
    autocast = fabric is None and args.precision == "bf16-mixed"
    if fabric is not None:
        model, opt = fabric.setup(model, opt)
        loader = fabric.setup_dataloaders(loader)
        backward = fabric.backward
    else:
        backward = lambda loss: loss.backward()
    print(f"data: Fashion-MNIST, {len(x_train)} train / {len(x_test)} test images; model {args.model}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters; AdamW lr {args.lr:g} (cosine), "
          f"batch {args.batch_size}, seed {args.seed}", file=sys.stderr)

    # ---- training ----
    log, best, total_samples, total_train_time = [], 0.0, 0, 0.0
    t_all = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        t0 = time.perf_counter()
        loss_sum, batches, samples = 0.0, 0, 0
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            backward(loss)
            opt.step()
            sched.step()
            batches += 1
            value = loss.item()
            if not math.isfinite(value):
                print(f"torch_trainer.py: the loss is {value} at step {(epoch - 1) * steps_per_epoch + batches} "
                      f"(epoch {epoch}, batch {batches}) under {args.precision}; training stopped", file=sys.stderr)
                return 1
            loss_sum += value
            samples += x.shape[0]
        train_time = time.perf_counter() - t0
        total_samples += samples
        total_train_time += train_time
        acc = accuracy(model, x_test, y_test, autocast)
        best = max(best, acc)
        rec = {"epoch": epoch, "train_loss": loss_sum / batches, "seconds": train_time,
               "samples_per_s": samples / train_time, "test_accuracy": acc}
        log.append(rec)
        print(f"epoch {epoch}/{args.epochs}: train loss {rec['train_loss']:.4f}, {train_time:.1f}s, "
              f"{rec['samples_per_s']:,.0f} samples/s, test accuracy {100 * acc:.2f}%", file=sys.stderr)

    # ---- summary ----
    rate = total_samples / total_train_time if total_train_time > 0 else 0.0
    print(f"summary: {args.model}, {args.epochs} epochs in {time.perf_counter() - t_all:.1f}s, mean "
          f"{rate:,.0f} samples/s, best test accuracy {100 * best:.2f}% (precision {args.precision}, "
          f"runner {runner})", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "precision": args.precision, "epochs": log,
                       "best_test_accuracy": best, "mean_rate": rate}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

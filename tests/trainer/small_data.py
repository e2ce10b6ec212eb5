#!/usr/bin/env python3
"""A small dataset in Fashion-MNIST's format for the trainer's end-to-end tests, so that they
check options, checkpoints and processes in seconds instead of training on the real data
(whether the models learn is TrainE2E's and precision_auto.sh's question):
  <dir>/train-images-idx3-ubyte.gz, train-labels-... : <train> images (256 by default)
  <dir>/t10k-images-idx3-ubyte.gz, t10k-labels-...   : <test> images (100 by default)
  <dir>/text.txt                                      : a short text for the GPT
Each image is noise with a bright 6x6 patch whose place is the class: an MLP learns it in an
epoch or two. The same seed writes the same files.
Usage: small_data.py <dir> [<train> <test>]"""
import gzip
import os
import random
import struct
import sys

d = sys.argv[1]
n_train, n_test = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (256, 100)
os.makedirs(d, exist_ok=True)
rnd = random.Random(0)


def write(split, n):
    labels, img = [rnd.randrange(10) for _ in range(n)], bytearray()
    for c in labels:
        px = [rnd.randrange(64) for _ in range(784)]
        for r in range(2 + 8 * (c // 4), 8 + 8 * (c // 4)):
            for col in range(2 + 8 * (c % 4), 8 + 8 * (c % 4)):
                px[r * 28 + col] = 200 + rnd.randrange(56)
        img += bytes(px)
    with gzip.open(f"{d}/{split}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, 28, 28) + img)
    with gzip.open(f"{d}/{split}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 2049, n) + bytes(labels))


write("train", n_train)
write("t10k", n_test)
words = "the quick brown fox jumps over a lazy dog while seven wizards box and hum".split()
with open(f"{d}/text.txt", "w") as f:
    f.write(" ".join(rnd.choice(words) for _ in range(400)) + "\n")

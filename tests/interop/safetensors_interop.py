#!/usr/bin/env python3
"""Checkpoints between ampgrad and the Hugging Face `safetensors` package (with numpy).

Run by tests/nn/test_safetensors.cpp:

  safetensors_interop.py check FILE EXPECTED_JSON
      FILE was written by ag::nn::save. EXPECTED_JSON, written by the same test, gives the
      metadata and each tensor's dtype, shape and values (row-major; non-finite floats as
      the strings "nan", "inf", "-inf"). Reads FILE with the package and compares: names,
      dtypes, shapes, values (exactly, signed zeros included) and metadata. Exit 0 when
      everything agrees, else 1 with the differences on stderr.

  safetensors_interop.py write FILE
      Writes FILE with safetensors.numpy.save_file: the tensors in WRITTEN and METADATA
      below, whose values the C++ test checks after ag::nn::load.
"""
import json
import sys

import numpy as np
import safetensors
from safetensors import safe_open
from safetensors.numpy import save_file

# safetensors dtype name -> numpy dtype. numpy has no bfloat16: BF16 is read as its raw
# uint16 bits and widened to float32 (bf16 is the high half of a float32).
NUMPY = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "U8": np.uint8,
    "BOOL": np.bool_,
}

WRITTEN = {
    "f32": np.array([[1.5, -2.0, 0.0], [3.25, -0.0, 1e-3]], np.float32),
    "f64": np.array([np.pi, -1e300, 5e-324], np.float64),
    "f16": np.array([1.0, -2.5, 65504.0, 2.0**-24], np.float16),
    "i64": np.array([[2**40, -3], [0, 2**63 - 1]], np.int64),
    "i32": np.array([-7, 2**31 - 1, 5], np.int32),
    "u8": np.array([0, 255, 17], np.uint8),
    "bool": np.array([True, False, True, True]),
    "scalar": np.array(2.5, np.float32),
    "empty": np.zeros((0, 3), np.float32),
}
METADATA = {"format": "np", "written_by": "safetensors.numpy.save_file"}


def expected_array(spec):
    dtype = np.float32 if spec["dtype"] == "BF16" else NUMPY[spec["dtype"]]
    values = [float(v) if isinstance(v, str) else v for v in spec["values"]]
    return np.array(values, dtype=dtype).reshape(spec["shape"])


def same_values(got, want):
    if got.dtype.kind == "f":
        return np.array_equal(got, want, equal_nan=True) and np.array_equal(
            np.signbit(got), np.signbit(want))
    return np.array_equal(got, want)


def check(path, expected_path):
    with open(expected_path, encoding="utf-8") as f:
        expected = json.load(f)
    want_tensors = expected["tensors"]
    problems = []
    with open(path, "rb") as f:
        # The package's own parser: validates the whole file and gives every tensor's bytes.
        raw = dict(safetensors.deserialize(f.read()))
    with safe_open(path, framework="np") as f:
        if sorted(f.keys()) != sorted(want_tensors):
            problems.append(f"names {sorted(f.keys())} != {sorted(want_tensors)}")
        if (f.metadata() or {}) != expected["metadata"]:
            problems.append(f"metadata {f.metadata()} != {expected['metadata']}")
        for name, spec in want_tensors.items():
            if name not in f.keys():
                continue
            view = f.get_slice(name)
            if view.get_dtype() != spec["dtype"] or list(view.get_shape()) != spec["shape"]:
                problems.append(f"{name}: {view.get_dtype()} {view.get_shape()} != "
                                f"{spec['dtype']} {spec['shape']}")
                continue
            if spec["dtype"] == "BF16":
                bits = np.frombuffer(bytes(raw[name]["data"]), dtype="<u2").astype(np.uint32)
                got = (bits << 16).view(np.float32).reshape(spec["shape"])
            else:
                got = f.get_tensor(name)
            want = expected_array(spec)
            if not same_values(got, want):
                problems.append(f"{name}: values {got.ravel().tolist()} != {want.ravel().tolist()}")
    for p in problems:
        print(f"safetensors_interop: {path}: {p}", file=sys.stderr)
    return 1 if problems else 0


def main(argv):
    if len(argv) == 4 and argv[1] == "check":
        return check(argv[2], argv[3])
    if len(argv) == 3 and argv[1] == "write":
        save_file(WRITTEN, argv[2], metadata=METADATA)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Shared pieces of the benchmark scripts: Google Benchmark's JSON, the machine's fingerprint,
the result file's schema, and the statistics that compare two sets of repetitions.

Used by scripts/bench_table.py and scripts/peer_table.py (parsing Google Benchmark's names and
files), scripts/bench-report (writes a result file), scripts/bench-compare and
scripts/bench-history (read them). Standard library only; scipy is used where it imports
(Debian's python3-scipy), else the exact Mann-Whitney U test below.

A result file (SCHEMA, version SCHEMA_VERSION) is one JSON object:
  schema, schema_version, created (UTC, ISO 8601), preset, duration_s, command
  ampgrad    {version, commit, commit_date, dirty, build_dir, build_type, onednn, cuda}
  machine    {fingerprint, cpu_model, cpu_vendor, cpu_features, onednn_isa, logical_cores,
              threads_used, memory_bytes, gpus: [{name, compute_capability}], os, kernel,
              compiler, onednn_version, cuda_version, load_avg_start, load_avg_end}
  settings   {repetitions, threads, models, epochs, e2e_repetitions, profile} the run was asked for
  precision  {auto: {device: {choice, reason}}, verdicts: {device: {dtype: native|emulated|
              unsupported}}, reasons: [[device, dtype, verdict, why]], run: [precisions
              measured], emulated: [those measured although the hardware emulates them]}
  peers      {name: version line} for the peers measured in this run
  figures    [{id, group, model, precision, impl, role, metric, unit, better, values,
              threads, flops_per_item, emulated, source, error, note, epochs, profile, device}]
  errors     [text] for the parts that did not run
A figure's id is stable from run to run (what bench-compare and bench-history match on);
values holds every repetition; role is "ours", "peer" (PyTorch eager, torch.compile,
Fabric) or "ceiling" (raw oneDNN on the CPU; on a GPU cuBLASLt for a GEMM, a device-to-device
copy for a memory-bound op); better is "higher" or "lower".
device   where the figure was measured: "cpu", or "cuda:0" for bench_cuda's figures and the
         trainer on --accelerator cuda. Optional (a file without it, any version, reads as
         "cpu"), so the schema version stays. A figure's identity is its id and its device
         (figure_key: the id alone on the CPU, "<id>@<device>" elsewhere): the same id on the
         CPU and the GPU are two figures.
settings.gpu (optional) says whether the GPU part ran: {run: true, device, name} or
         {run: false, why} (e.g. "no CUDA device: GPU part not run").
Since schema_version 2 (version 1 files read as having neither):
  epochs   of a trainer figure (trainer/...): per run of the trainer, its per-epoch records
           as the trainer's --json wrote them ({epoch, train_loss, test_accuracy, seconds,
           samples_per_s, ...}); null elsewhere
  profile  of a step figure whose target was not met: {entries: [{percent, object, symbol}]
           (perf's self time, the top ones), samples, command, threads} or {error: why there
           is none}; null where none was asked for (a target met, or --no-profile)
"""
import hashlib
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys

SCHEMA = "ampgrad-bench-result"
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # older files lack only the fields added since (see above)
OURS = "ampgrad"
UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
ALPHA = 0.05
# The machine fields that make two result files comparable (not the threads used or the load).
FINGERPRINT_FIELDS = ("cpu_model", "cpu_vendor", "cpu_features", "logical_cores", "memory_bytes", "gpus")
# bench_train's row prefixes -> the precision they run in.
STEP_GROUPS = {"train_step": "32-true", "amp_train_step": "bf16-mixed", "train_step_medium": "32-true-medium"}
SYSTEM_PYTHON = "/usr/bin/python3"


# ---------------------------------------------------------------- Google Benchmark's JSON

def split_name(name):
    """'matmul/float32/256/ampgrad/min_time:0.200/real_time' -> ('matmul/float32/256', 'ampgrad')."""
    parts = [p for p in name.split("/") if ":" not in p and p not in ("real_time", "manual_time")]
    if len(parts) < 2:
        return name, OURS
    return "/".join(parts[:-1]), parts[-1]


def load_json(path):
    """The parsed file, or None when it is missing or not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def rate_counter(b):
    """(name, value) of a benchmark entry's rate counter ('samples/s', 'GFLOP/s', ...; not
    Google Benchmark's own items_per_second), or None."""
    for key, value in b.items():
        if key.endswith("/s") and key != "items_per_second" and isinstance(value, (int, float)):
            return key, value
    return None


def time_ns(b):
    return b["real_time"] * UNIT_NS.get(b.get("time_unit", "ns"), 1.0)


def step_row(name):
    """bench_train's 'amp_train_step/gpt/ampgrad' -> ('bf16-mixed', 'gpt'); None for other rows."""
    parts = name.split("/")
    if len(parts) >= 2 and parts[0] in STEP_GROUPS:
        return STEP_GROUPS[parts[0]], parts[1]
    return None


def gbench_repetitions(data):
    """{run_name: {"runs": [entry of each repetition], "error": text or None}} of a Google
    Benchmark JSON object, in the order the file lists them (aggregates left out)."""
    out = {}
    for b in (data or {}).get("benchmarks", []):
        key = b.get("run_name", b["name"])
        r = out.setdefault(key, {"runs": [], "error": None})
        if b.get("error_occurred"):
            r["error"] = r["error"] or b.get("error_message", "error")
            continue
        if b.get("run_type") == "aggregate":
            continue
        r["runs"].append(b)
    return out


# ---------------------------------------------------------------- the machine

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cmake_cache(build):
    values = {}
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                m = re.match(r"^(CMAKE_BUILD_TYPE|AMPGRAD_ONEDNN|AMPGRAD_CUDA|CMAKE_CXX_COMPILER|"
                             r"CMAKE_HOME_DIRECTORY):\w+=(.*)$", line.strip())
                if m:
                    values[m.group(1)] = m.group(2)
    except OSError:
        pass
    return values


def parse_ampgrad_info(text):
    """What `ampgrad-info` prints, as a dict: model, vendor, logical_cores, features,
    onednn_isa, build, cuda (its line when no device), gpus [{name, compute_capability}], verdicts {device: {dtype: verdict}}, reasons
    [[device, dtype, verdict, why]], auto {device: {choice, reason}}. Missing parts are left out."""
    info = {"verdicts": {}, "reasons": [], "auto": {}}
    section, dtypes = None, []
    for line in text.splitlines():
        if not line.strip():
            section = None  # a blank line ends a section; the next line names the new one
            continue
        head = line.split()[0]
        if section is None:
            section = head
        if section == "build" and head == "build":
            info["build"] = line[len("build"):].strip()
        elif section == "cpu":
            body = line.strip()
            if head == "cpu":
                info["model"] = body[len("cpu"):].strip()
            elif body.startswith("vendor"):
                m = re.match(r"vendor (\S+), (\d+) logical cores", body)
                if m:
                    info["vendor"], info["logical_cores"] = m.group(1), int(m.group(2))
            elif body.startswith("flags"):
                info["features"] = body.split()[1:]
            elif body.startswith("oneDNN ISA"):
                info["onednn_isa"] = body[len("oneDNN ISA"):].strip()
        elif section.startswith("cuda") and not line.startswith(" "):
            if head == "cuda":
                info["cuda"] = line[len("cuda"):].strip()
            else:  # "cuda:N  <name>", then its "compute capability X.Y, ..." line
                info.setdefault("gpus", []).append({"name": line[len(head):].strip(), "compute_capability": None})
        elif section.startswith("cuda") and line.strip().startswith("compute capability") and info.get("gpus"):
            info["gpus"][-1]["compute_capability"] = line.split()[2].rstrip(",")
        elif section == "verdict":
            cols = line.split()
            if head == "verdict":
                dtypes = cols[1:]
            elif len(cols) == len(dtypes) + 1:
                info["verdicts"][cols[0]] = dict(zip(dtypes, cols[1:]))
        elif section == "reasons" and line.startswith(" "):
            m = re.match(r"\s+(\S+)\s+(\S+)\s+(\S+)\s+(.*)$", line)
            if m:
                info["reasons"].append(list(m.groups()))
        elif section == "precision" and line.startswith(" "):
            m = re.match(r"\s+(\S+)\s+(\S+)\s+(.*)$", line)
            if m:
                info["auto"][m.group(1)] = {"choice": m.group(2), "reason": m.group(3)}
    return info


def precisions_to_run(info, include_emulated=False):
    """{run, emulated, left_out} for bench_train's precisions on the CPU of `info`
    (parse_ampgrad_info): 32-true always; bf16-mixed where ampgrad-info calls the CPU's
    bfloat16 native, or, with include_emulated, marked emulated; else left out, saying why."""
    bf16 = info.get("verdicts", {}).get("cpu", {}).get("bfloat16", "unknown")
    out = {"run": ["32-true"], "emulated": [], "left_out": []}
    if bf16 == "native" or include_emulated:
        out["run"].append("bf16-mixed")
        if bf16 != "native":
            out["emulated"].append("bf16-mixed")
    else:
        out["left_out"].append(["bf16-mixed", f"the CPU's bfloat16 is {bf16} (ampgrad-info); "
                                              "--include-emulated runs it"])
    return out


def _run(cmd, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)
    except (OSError, subprocess.SubprocessError):
        return None


def git_info(root):
    """{commit, commit_date, dirty} of the checkout at root (None fields outside git)."""
    out = {"commit": None, "commit_date": None, "dirty": None}
    p = _run(["git", "-C", root, "log", "-1", "--format=%H %cI"])
    if p and p.returncode == 0 and p.stdout.strip():
        out["commit"], out["commit_date"] = p.stdout.split()
        d = _run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"])
        out["dirty"] = bool(d and d.stdout.strip())
    return out


def memory_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def gpus():
    """[{name, compute_capability}] from nvidia-smi, [] without one."""
    p = _run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"])
    if not p or p.returncode != 0:
        return []
    out = []
    for line in p.stdout.splitlines():
        if line.strip():
            name, _, cc = line.partition(",")
            out.append({"name": name.strip(), "compute_capability": cc.strip() or None})
    return out


def os_name():
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return sys.platform


def compiler_version(path):
    p = _run([path or "c++", "--version"])
    return p.stdout.splitlines()[0].strip() if p and p.returncode == 0 and p.stdout else None


def package_version(name):
    p = _run(["dpkg-query", "-W", "-f=${Version}", name])
    return p.stdout.strip() if p and p.returncode == 0 and p.stdout.strip() else None


def cuda_version():
    p = _run(["nvcc", "--version"])
    if p and p.returncode == 0:
        m = re.search(r"release (\S+),", p.stdout)
        if m:
            return m.group(1)
    return None


def fingerprint(machine):
    """A short hash of the hardware fields (FINGERPRINT_FIELDS): equal on the same machine."""
    text = json.dumps({k: machine.get(k) for k in FINGERPRINT_FIELDS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def machine_differences(a, b):
    """[(field, value in a, value in b)] of the fingerprint fields that differ."""
    return [(k, a.get(k), b.get(k)) for k in FINGERPRINT_FIELDS if a.get(k) != b.get(k)]


# ---------------------------------------------------------------- result files

def figure(id_, *, metric, unit, better, values, group, model=None, precision=None, impl=OURS,
           role="ours", threads=None, flops_per_item=None, emulated=False, source=None, error=None,
           note=None, epochs=None, profile=None, device="cpu"):
    assert better in ("higher", "lower"), better
    return {"id": id_, "group": group, "model": model, "precision": precision, "impl": impl, "role": role,
            "metric": metric, "unit": unit, "better": better, "values": [float(v) for v in values],
            "threads": threads, "flops_per_item": flops_per_item, "emulated": bool(emulated), "source": source,
            "error": error, "note": note, "epochs": epochs, "profile": profile, "device": device}


def load_result(path):
    """A result file, checked to be one (raises ValueError naming the file and what is wrong)."""
    data = load_json(path)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not an ampgrad benchmark result file (no \"schema\": \"{SCHEMA}\")")
    if data.get("schema_version") not in READABLE_VERSIONS:
        raise ValueError(f"{path}: schema_version {data.get('schema_version')!r}, this tool reads "
                         f"{', '.join(map(str, READABLE_VERSIONS))}")
    for f in data.get("figures", []):
        for key in ("id", "values", "better", "unit"):
            if key not in f:
                raise ValueError(f"{path}: figure {f.get('id', '?')!r} has no {key!r}")
    return data


def device_of(f):
    """A figure's device; "cpu" where the file predates the field."""
    return f.get("device") or "cpu"


def figure_key(f):
    """A figure's identity across files: its id on the CPU, "<id>@<device>" elsewhere (the
    trainer's id on the CPU and on cuda:0 are two figures)."""
    d = device_of(f)
    return f["id"] if d == "cpu" else f"{f['id']}@{d}"


def figures_by_id(result):
    """{figure_key: figure}: a CPU figure under its bare id."""
    return {figure_key(f): f for f in result.get("figures", [])}


def median(values):
    return statistics.median(values) if values else None


# ---------------------------------------------------------------- statistics

def _scipy_stats():
    if os.environ.get("AMPGRAD_BENCH_NO_SCIPY"):
        return None
    try:
        import scipy.stats
        return scipy.stats
    except ImportError:
        return None


def min_exact_p(n, m):
    """The smallest two-sided p-value the exact Mann-Whitney U test can give with n and m
    repetitions (all of one side below all of the other): 2 / C(n + m, n)."""
    return min(1.0, 2.0 / math.comb(n + m, n)) if n and m else 1.0


def min_repetitions(alpha=ALPHA):
    """The fewest repetitions per side (the same on both) at which the exact two-sided test
    can reach alpha: the smallest k with 2 / C(2k, k) <= alpha (4 at alpha 0.05)."""
    k = 1
    while min_exact_p(k, k) > alpha:
        k += 1
    return k


def _exact_u_cdf(n, m):
    """Counts of each U = 0..n*m over the C(n+m, n) equally likely orderings (no ties)."""
    # f[i][j][u]: orderings of i x's and j y's with u pairs (x > y); built row by row.
    prev = [[1] for _ in range(m + 1)]  # i = 0: U = 0 for every j
    for i in range(1, n + 1):
        cur = [[1]]  # j = 0: U = 0
        for j in range(1, m + 1):
            # the largest element is an x (beats all j y's) or a y (adds nothing)
            a, b = prev[j], cur[j - 1]
            size = i * j + 1
            row = [0] * size
            for u, c in enumerate(a):
                row[u + j] += c
            for u, c in enumerate(b):
                row[u] += c
            cur.append(row)
        prev = cur
    return prev[m]


def mann_whitney_p(a, b):
    """Two-sided p-value of the Mann-Whitney U test of a against b: scipy.stats.mannwhitneyu
    where scipy imports, else exact without ties and the normal approximation (tie-corrected,
    with continuity correction) with ties, as scipy's method "auto" does."""
    st = _scipy_stats()
    if st is not None:
        return float(st.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    n, m = len(a), len(b)
    pooled = sorted(a + b)
    ranks = {}
    i = 0
    while i < len(pooled):  # mid-ranks of tied values
        j = i
        while j + 1 < len(pooled) and pooled[j + 1] == pooled[i]:
            j += 1
        ranks[pooled[i]] = (i + j) / 2 + 1
        i = j + 1
    u1 = sum(ranks[x] for x in a) - n * (n + 1) / 2
    ties = len(set(pooled)) < len(pooled)
    if not ties and min(n, m) <= 8:
        counts = _exact_u_cdf(n, m)
        total = math.comb(n + m, n)
        u = max(u1, n * m - u1)
        upper = sum(counts[int(round(u)):]) / total
        return min(1.0, 2 * upper)
    mu = n * m / 2
    tie_term = sum(c ** 3 - c for c in (pooled.count(v) for v in set(pooled)))
    sigma = math.sqrt(n * m / 12 * ((n + m + 1) - tie_term / ((n + m) * (n + m - 1))))
    if sigma == 0:
        return 1.0
    z = (abs(u1 - mu) - 0.5) / sigma
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def bootstrap_ratio_ci(a, b, level=0.95, rounds=2000, seed=0):
    """A percentile bootstrap interval of median(b) / median(a): each round resamples both
    sides with replacement. Fixed seed, so the same files give the same interval."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(rounds):
        ma = statistics.median(rng.choices(a, k=len(a)))
        mb = statistics.median(rng.choices(b, k=len(b)))
        if ma:
            ratios.append(mb / ma)
    if not ratios:
        return None, None
    ratios.sort()
    lo = ratios[int((1 - level) / 2 * (len(ratios) - 1))]
    hi = ratios[int((1 + level) / 2 * (len(ratios) - 1))]
    return lo, hi


def compare_values(a, b, better, alpha=ALPHA):
    """B against A: {ratio (median b / median a), ci (lo, hi), p, verdict, why}. verdict is
    "faster" / "slower" (B better / worse, by the figure's direction), "within noise", or
    "too few repetitions" when the exact test could not reach alpha with len(a), len(b)."""
    ma, mb = median(a), median(b)
    out = {"ratio": mb / ma if ma else None, "ci": (None, None), "p": None, "n": (len(a), len(b))}
    if len(a) >= 2 and len(b) >= 2:
        out["ci"] = bootstrap_ratio_ci(a, b)
    floor = min_exact_p(len(a), len(b))
    if floor > alpha:
        k = min_repetitions(alpha)
        out["verdict"] = "too few repetitions"
        if min(len(a), len(b)) <= 1:
            out["why"] = f"a single value on a side: no test (it needs at least {k} on each side)"
            return out
        out["why"] = (f"{len(a)} and {len(b)} repetitions: the exact U test's smallest p is {floor:.3f} > {alpha}; "
                      f"it needs 2 / C(n + m, n) <= {alpha}, at least {k} on each side")
        return out
    p = mann_whitney_p(list(a), list(b))
    out["p"] = p
    if p >= alpha:
        out["verdict"], out["why"] = "within noise", f"p = {p:.3g} >= {alpha}"
    else:
        b_higher = mb > ma
        b_better = b_higher if better == "higher" else not b_higher
        out["verdict"] = "faster" if b_better else "slower"
        out["why"] = f"p = {p:.3g} < {alpha}"
    return out


# ---------------------------------------------------------------- profiles (Linux perf)

PERF_INSTALL = "Debian's linux-perf; scripts/install-test-deps installs it"
PROFILE_TOP = 12


def parse_perf_report(text, top=PROFILE_TOP):
    """The entries of `perf report --stdio --sort dso,sym --field-separator=TAB` output, the
    largest first: [{percent, object, symbol}], at most `top`. JIT code's object "[JIT] tid N"
    reads "[JIT]" (the thread id differs from run to run); perf's [.] / [k] marks are dropped
    (the object says which is the kernel)."""
    entries = []
    for line in text.splitlines():
        if line.startswith("#") or "\t" not in line:
            continue
        cols = [c.strip() for c in line.split("\t")]
        m = re.fullmatch(r"([\d.]+)%", cols[0])
        if not m or len(cols) < 3:
            continue
        obj = re.sub(r"^\[JIT\] tid \d+$", "[JIT]", cols[1])
        sym = re.sub(r"^\[[.kgHu]\]\s*", "", cols[2])
        entries.append({"percent": float(m.group(1)), "object": obj, "symbol": sym})
    entries.sort(key=lambda e: -e["percent"])
    return entries[:top]


def _perf_denied(text):
    return any(w in text for w in ("perf_event_paranoid", "Permission denied", "Operation not permitted",
                                   "No permission", "Access to performance monitoring"))


def perf_profile(cmd, env=None, top=PROFILE_TOP, percent_limit=0.5, perf=None, timeout=300):
    """Runs cmd under `perf record` (self time only: the report keeps no call graphs) and
    returns {entries (parse_perf_report), samples and event (perf's header), command}, or
    {error: why there is no profile} where perf is missing, not permitted, or the command
    failed. JIT code is named where it writes a perf map (/tmp/perf-PID.map, e.g. oneDNN's
    DNNL_JIT_PROFILE=2 in env): the command keeps its pid (sh's exec), and the map is removed
    once read."""
    import shlex
    import shutil
    import tempfile
    perf = perf or shutil.which("perf")
    if not perf or not os.access(perf, os.X_OK):
        return {"error": f"perf not found ({PERF_INSTALL})"}
    shown = " ".join(shlex.quote(c) for c in cmd)
    with tempfile.TemporaryDirectory(prefix="ampgrad-perf.") as tmp:
        data, pidfile = os.path.join(tmp, "perf.data"), os.path.join(tmp, "pid")
        wrapped = ["/bin/sh", "-c", 'echo $$ > "$0"; exec "$@"', pidfile] + list(cmd)
        try:
            rec = subprocess.run([perf, "record", "-q", "-o", data, "--"] + wrapped, env=env, capture_output=True,
                                 text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"perf record did not finish within {timeout} s", "command": shown}
        except OSError as e:
            return {"error": f"perf does not run: {e}", "command": shown}
        pid = None
        try:
            with open(pidfile) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            pass
        try:
            tail = " | ".join(l.strip() for l in rec.stderr.splitlines()[-3:] if l.strip())
            if _perf_denied(rec.stderr):
                return {"error": f"perf is not permitted here: {tail}", "command": shown}
            if rec.returncode != 0 or not os.path.exists(data):
                return {"error": f"perf record: status {rec.returncode}: {tail or 'no message'}", "command": shown}
            rep = _run([perf, "report", "-i", data, "--stdio", "--no-children", "--percent-limit", str(percent_limit),
                        "--sort", "dso,sym", "-g", "none", "--field-separator=\t"])
        finally:
            if pid:  # the JIT's map of this one process
                try:
                    os.remove(f"/tmp/perf-{pid}.map")
                except OSError:
                    pass
    if rep is None or rep.returncode != 0:
        return {"error": f"perf report failed: {(rep.stderr.strip().splitlines() or ['no message'])[-1] if rep else 'did not run'}",
                "command": shown}
    entries = parse_perf_report(rep.stdout, top)
    if not entries:
        return {"error": "perf recorded no samples", "command": shown}
    m = re.search(r"^# Samples: (\S+)\s+of event '([^']+)'", rep.stdout, re.M)
    return {"entries": entries, "samples": m.group(1) if m else None, "event": m.group(2) if m else None,
            "command": shown}


# ---------------------------------------------------------------- plotting and HTML

def ensure_system_python(module):
    """Re-runs this script under Debian's python3 when `module` (matplotlib, scipy) does not
    import here but the system python has it (a pyenv or venv python earlier on PATH)."""
    try:
        __import__(module)
        return True
    except ImportError:
        pass
    # (no loop: the system python is asked first, and it does not re-run itself)
    if os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON) and os.path.exists(SYSTEM_PYTHON):
        p = _run([SYSTEM_PYTHON, "-c", f"import {module}"])
        if p and p.returncode == 0:
            os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON] + sys.argv)
    return False


def png_data_uri(fig):
    """A matplotlib figure as a data: URI of its PNG."""
    import base64
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def html_escape(text):
    import html
    return html.escape("" if text is None else str(text))


class Raw(str):
    """A table cell that is HTML already (a nested table): html_table does not escape it."""


def html_table(header, rows, classes=None, table_class=None):
    """rows: lists of cells (str, or Raw for HTML); classes: per row a CSS class or None."""
    tcls = f' class="{table_class}"' if table_class else ""
    out = [f"<table{tcls}><thead><tr>" + "".join(f"<th>{html_escape(h)}</th>" for h in header) +
           "</tr></thead><tbody>"]
    for i, r in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{c if isinstance(c, Raw) else html_escape(c)}</td>" for c in r)
                   + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


# The page's one script: after load, records on <body> how many images decoded, so that a
# headless browser's DOM dump shows whether every plot rendered.
PAGE_SCRIPT = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute('data-images-decoded', ok + '/' + imgs.length);
});
</script>"""

PAGE_STYLE = """<style>
body { font-family: sans-serif; margin: 1.5em; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; }
th { background: #f0f0f0; }
tr.met td { background: #e6f4e6; } tr.missed td { background: #fbe3e3; } tr.skipped td { color: #777; }
tr.faster td { background: #e6f4e6; } tr.slower td { background: #fbe3e3; } tr.few td { color: #777; }
img { max-width: 100%; display: block; margin: 0.5em 0; }
.note { color: #555; font-size: 0.9em; }
table.profile { margin: 0; font-size: 0.85em; } table.profile td { background: #fff; }
</style>"""


def html_page(title, body):
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html_escape(title)}</title>{PAGE_STYLE}</head>\n<body>\n<h1>{html_escape(title)}</h1>\n"
            f"{body}\n{PAGE_SCRIPT}\n</body></html>\n")


def fmt_num(v, digits=None):
    if v is None:
        return "-"
    if digits is None:
        digits = 0 if abs(v) >= 100 else (2 if abs(v) >= 1 else 3)
    return f"{v:,.{digits}f}"

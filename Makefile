# The front door. `make demo` and `make test` are the whole setup on a fresh machine.
JOBS ?= 2
BUILD ?= build/release
BUILD_LITE ?= build/lite
# clang with AddressSanitizer, UndefinedBehaviorSanitizer and the libFuzzer targets (Eigen
# and the CUDA emulator: oneDNN's JIT, the CUDA runtime and OpenMPI are not built for the
# sanitizers; the emulator's device memory is exact-size heap blocks, so an out-of-bounds
# access in a CUDA kernel is reported with the kernel's frame).
BUILD_SAN ?= build/sanitize
FUZZ_SECONDS ?= 120
# make test's fuzz smoke: each libFuzzer target for this long.
FUZZ_SMOKE_SECONDS ?= 15
# make fuzz's run of the random-graph gradient fuzzer (tests/autograd/graph_fuzz.h).
GRAPH_FUZZ_SECONDS ?= 120
CMAKE_FLAGS ?=
# ccache (when installed) rewrites paths under the checkout as relative ones, so a fresh
# clone in another folder (CI's) reuses what any checkout compiled.
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= true

.PHONY: all deps test-deps build build-lite configure-sanitize build-sanitize build-fuzzers demo test test-sanitize \
  fuzz bench report clean format check-format

all: build

deps:
	@scripts/install-deps

# Python tooling for the safetensors interop test (a venv under build/pyenv, from PyPI), and
# Debian's matplotlib, scipy, chromium and linux-perf for the bench report and its tests (tests/tools).
# Without network the test skips and says how to install it; in CI (CI=true) a failed
# install fails, and so would the test (tests/support/testing.h: AGT_SKIP_UNLESS_CI).
test-deps:
	@scripts/install-test-deps || { if [ "$$CI" = true ]; then exit 1; fi; \
	  echo "make: scripts/install-test-deps failed; the safetensors interop test or the bench report test will skip"; }

# Release build with oneDNN (and CUDA when its toolkit is found).
build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The light configuration: Eigen alone, no oneDNN, no MPI, and the CUDA backend on the CUDA
# emulator (docs/cuda-emulator.md), so that every CUDA test runs here without a GPU. (A
# build without CUDA at all is its consumer.add_subdirectory test: tests/consumer.)
build-lite: deps
	@cmake -S . -B $(BUILD_LITE) -DCMAKE_BUILD_TYPE=Release -DAMPGRAD_ONEDNN=OFF -DAMPGRAD_CUDA=EMULATE -DAMPGRAD_MPI=OFF \
	  -DAMPGRAD_BUILD_BENCH=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD_LITE) -j $(JOBS)

configure-sanitize: deps
	@cmake -S . -B $(BUILD_SAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
	  -DCMAKE_CXX_COMPILER=clang++ \
	  -DAMPGRAD_SANITIZE=address,undefined -DAMPGRAD_FUZZ=ON -DAMPGRAD_ONEDNN=OFF -DAMPGRAD_CUDA=EMULATE -DAMPGRAD_MPI=OFF \
	  -DAMPGRAD_BUILD_BENCH=OFF -DAMPGRAD_BUILD_EXAMPLES=OFF >/dev/null

build-sanitize: configure-sanitize
	@cmake --build $(BUILD_SAN) -j $(JOBS)

# Only the library and the fuzzers of the sanitizer build (not its test program).
build-fuzzers: configure-sanitize
	@cmake --build $(BUILD_SAN) -j $(JOBS) --target fuzzers

demo: build
	@scripts/demo $(BUILD)

# Both configurations, and each libFuzzer target for FUZZ_SMOKE_SECONDS; each ctest ends with
# the skipped tests and their reasons, and a line "ctest: N passed, N failed, N skipped"
# (scripts/run-ctest); the full build's comes last, then the time each stage took
# (scripts/timed). Two tests run in the full configuration only, since what they check is
# the same code in both: the exhaustive conversion sweeps (every float32 pattern, per
# instruction set) and the MLP trained through Lite in every precision (the precisions'
# arithmetic; the Eigen-only products are checked op by op, and the MLP by hand still trains
# there).
STAGES = build/test-stages.txt
TIMED = scripts/timed $(STAGES)
test:
	@rm -f $(STAGES)
	@$(TIMED) "build (full)" $(MAKE) --no-print-directory build
	@$(TIMED) "build (Eigen-only, emulated CUDA)" $(MAKE) --no-print-directory build-lite
	@$(TIMED) "build (fuzzers)" $(MAKE) --no-print-directory build-fuzzers
	@$(TIMED) "test tools (PyPI, Debian)" $(MAKE) --no-print-directory test-deps
	@echo "== ctest: Eigen-only build with the CUDA emulator ($(BUILD_LITE)) =="
	@JOBS=$(JOBS) $(TIMED) "ctest (Eigen-only, emulated CUDA)" scripts/run-ctest $(BUILD_LITE) -E 'Exhaustive|TrainE2E.LiteMixedPrecisions'
	@echo "== fuzz smoke: each target for $(FUZZ_SMOKE_SECONDS) s ($(BUILD_SAN)) =="
	@$(TIMED) "fuzz smoke" scripts/fuzz $(BUILD_SAN) $(FUZZ_SMOKE_SECONDS)
	@echo "== ctest: full build ($(BUILD)) =="
	@JOBS=$(JOBS) $(TIMED) "ctest (full)" scripts/run-ctest $(BUILD)
	@echo "== make test: seconds per stage =="
	@awk '{ t += $$1; print "  " $$0 } END { print "  " t " in all" }' $(STAGES)

# The whole suite under AddressSanitizer and UndefinedBehaviorSanitizer (CI runs it after
# `make test`); a finding fails its test. Left out, as 15-50 times slower under the
# sanitizers and covered by shorter tests of the same code: the exhaustive conversion tests
# (all 2^32 float32 patterns; the tests of all 2^16 half patterns run) and the end-to-end
# convergence runs (TrainE2E: hundreds of training steps on Fashion-MNIST).
# allocator_may_return_null: a huge allocation fails as it does without ASan, so the
# library's own "out of memory" error is what gets tested.
test-sanitize: build-sanitize test-deps
	@echo "== ctest: sanitizer build ($(BUILD_SAN)) =="
	@ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  JOBS=$(JOBS) scripts/run-ctest $(BUILD_SAN) -E 'Exhaustive|TrainE2E'

# Every libFuzzer target for FUZZ_SECONDS each (scripts/fuzz), then the graph fuzzer.
fuzz: build-sanitize
	@scripts/fuzz $(BUILD_SAN) $(FUZZ_SECONDS)
	@$(BUILD_SAN)/tests/ampgrad_graph_fuzz --seconds $(GRAPH_FUZZ_SECONDS)

bench: build
	@scripts/bench $(BUILD)

# The benchmark suite into one result file under build/bench-results/ and an HTML report
# next to it (scripts/bench-report): PRESET=quick (a few minutes) or full (with the peers).
PRESET ?= quick
report: build
	@scripts/bench-report --preset $(PRESET) --build $(BUILD) --html

# The C++ lines changed since .clang-format was adopted, in the house style (CI checks them).
format: deps
	@scripts/check-format --fix

check-format: deps
	@scripts/check-format

clean:
	rm -rf build

# The front door. `make demo` and `make test` are the whole setup on a fresh machine.
JOBS ?= 2
BUILD ?= build/release
BUILD_LITE ?= build/lite
# clang with AddressSanitizer, UndefinedBehaviorSanitizer and the libFuzzer targets (Eigen
# only: oneDNN's JIT and the CUDA runtime are not built for the sanitizers).
BUILD_SAN ?= build/sanitize
FUZZ_SECONDS ?= 120
CMAKE_FLAGS ?=

.PHONY: all deps test-deps build build-lite build-sanitize demo test test-sanitize fuzz bench clean

all: build

deps:
	@scripts/install-deps

# Python tooling for the safetensors interop test (a venv under build/pyenv, from PyPI).
# Without network the test skips and says how to install it; in CI (CI=true) a failed
# install fails, and so would the test (tests/support/testing.h: AGT_SKIP_UNLESS_CI).
test-deps:
	@scripts/install-test-deps || { if [ "$$CI" = true ]; then exit 1; fi; \
	  echo "make: scripts/install-test-deps failed; the safetensors interop test will skip"; }

# Release build with oneDNN (and CUDA when its toolkit is found).
build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The lightest embedding: Eigen alone, no oneDNN, no CUDA.
build-lite: deps
	@cmake -S . -B $(BUILD_LITE) -DCMAKE_BUILD_TYPE=Release -DAMPGRAD_ONEDNN=OFF -DAMPGRAD_CUDA=OFF \
	  -DAMPGRAD_BUILD_BENCH=OFF -DAMPGRAD_BUILD_EXAMPLES=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD_LITE) -j $(JOBS)

build-sanitize: deps
	@cmake -S . -B $(BUILD_SAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DAMPGRAD_SANITIZE=address,undefined -DAMPGRAD_FUZZ=ON -DAMPGRAD_ONEDNN=OFF -DAMPGRAD_CUDA=OFF \
	  -DAMPGRAD_BUILD_BENCH=OFF -DAMPGRAD_BUILD_EXAMPLES=OFF >/dev/null
	@cmake --build $(BUILD_SAN) -j $(JOBS)

demo: build
	@scripts/demo $(BUILD)

# Both configurations; each ends with the skipped tests and their reasons, and a line
# "ctest: N passed, N failed, N skipped" (scripts/run-ctest); the full build's comes last.
test: build build-lite test-deps
	@echo "== ctest: Eigen-only build ($(BUILD_LITE)) =="
	@JOBS=$(JOBS) scripts/run-ctest $(BUILD_LITE)
	@echo "== ctest: full build ($(BUILD)) =="
	@JOBS=$(JOBS) scripts/run-ctest $(BUILD)

# The whole suite under AddressSanitizer and UndefinedBehaviorSanitizer (CI runs it after
# `make test`); a finding fails its test.
test-sanitize: build-sanitize test-deps
	@echo "== ctest: sanitizer build ($(BUILD_SAN)) =="
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 JOBS=$(JOBS) scripts/run-ctest $(BUILD_SAN)

# Every libFuzzer target for FUZZ_SECONDS each (scripts/fuzz).
fuzz: build-sanitize
	@scripts/fuzz $(BUILD_SAN) $(FUZZ_SECONDS)

bench: build
	@scripts/bench $(BUILD)

clean:
	rm -rf build

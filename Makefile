# The front door. `make demo` and `make test` are the whole setup on a fresh machine.
JOBS ?= 2
BUILD ?= build/release
BUILD_LITE ?= build/lite
CMAKE_FLAGS ?=

.PHONY: all deps test-deps build build-lite demo test bench clean

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

demo: build
	@scripts/demo $(BUILD)

# Both configurations; each ends with the skipped tests and their reasons, and a line
# "ctest: N passed, N failed, N skipped" (scripts/run-ctest); the full build's comes last.
test: build build-lite test-deps
	@echo "== ctest: Eigen-only build ($(BUILD_LITE)) =="
	@JOBS=$(JOBS) scripts/run-ctest $(BUILD_LITE)
	@echo "== ctest: full build ($(BUILD)) =="
	@JOBS=$(JOBS) scripts/run-ctest $(BUILD)

bench: build
	@scripts/bench $(BUILD)

clean:
	rm -rf build

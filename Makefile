# The front door. `make demo` and `make test` are the whole setup on a fresh machine.
JOBS ?= 2
BUILD ?= build/release
BUILD_LITE ?= build/lite
CMAKE_FLAGS ?=

.PHONY: all deps build build-lite demo test bench clean

all: build

deps:
	@scripts/install-deps

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

# Both configurations; the last lines are ctest's summary of the full build.
test: build build-lite
	@echo "== ctest: Eigen-only build ($(BUILD_LITE)) =="
	@cd $(BUILD_LITE) && ctest --output-on-failure -j $(JOBS)
	@echo "== ctest: full build ($(BUILD)) =="
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	@scripts/bench $(BUILD)

clean:
	rm -rf build

# energon quick start:
#   make demo   install what is missing, build, run the demo
#   make test   install what is missing, build (CUDA code compiled where nvcc
#               exists), run every test, then the tests again under ASan+UBSan
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
ASAN_BUILD ?= build-asan
CMAKE_FLAGS ?=

.PHONY: all deps build test test-fast test-asan demo clean fuzz

all: build

deps:
	@bash scripts/install-deps

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DENERGON_WERROR=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

# Tests of the release build.
test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The same tests built with AddressSanitizer + UBSan (CUDA off: the sanitizers
# cover host code; the CUDA objects are already compiled by the main build),
# and with fault injection (common/fault.h), which test_faults uses.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DENERGON_SANITIZE=ON \
	      -DENERGON_FAULTS=ON -DENERGON_CUDA=OFF -DENERGON_WERROR=ON $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    ctest --output-on-failure -j $(JOBS)

test: test-fast test-asan

# Every fuzz target for FUZZ_SECONDS each (make test runs them for 20 s).
FUZZ_SECONDS ?= 300
fuzz: deps
	bash tests/fuzz/run.sh $(FUZZ_SECONDS)

demo: build
	@bash scripts/demo.sh $(BUILD)/energon

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) demo-out

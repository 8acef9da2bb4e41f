# energon quick start:
#   make demo   install what is missing, build, run the demo
#   make test   install what is missing, build (CUDA code compiled where nvcc
#               exists), run every test, then the tests again under ASan+UBSan,
#               then the server's tests under ThreadSanitizer
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
CMAKE_FLAGS ?=

.PHONY: all deps build test test-fast test-asan test-tsan demo clean fuzz

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

# The server under ThreadSanitizer: test_serve (its scripts, the 256-connection
# load test tests/serve/load256.py among them) against a TSan build of the
# energon binary, the only one it runs. CUDA and MPI off: TSan checks host
# threads, and neither runtime is instrumented. A race stops the server at
# once (halt_on_error) and test_serve reports the server's log. 3.7 minutes
# on 2 idle cores (20 s to build, 3.4 min to test), 5 on busy ones: cheap
# enough to be part of make test.
TSAN_OPTIONS_TEST = halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Release -DENERGON_TSAN=ON \
	      -DENERGON_CUDA=OFF -DENERGON_MPI=OFF -DENERGON_WERROR=ON $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target energon
	cd $(TSAN_BUILD) && TSAN_OPTIONS=$(TSAN_OPTIONS_TEST) \
	    ctest --output-on-failure -R '^test_serve$$'

test: test-fast test-asan test-tsan

# Every fuzz target for FUZZ_SECONDS each (make test runs them for 20 s).
FUZZ_SECONDS ?= 300
fuzz: deps
	bash tests/fuzz/run.sh $(FUZZ_SECONDS)

demo: build
	@bash scripts/demo.sh $(BUILD)/energon

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) demo-out

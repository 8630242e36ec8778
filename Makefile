# Keel: `make run` starts a server with a demo agent; `make test` runs the whole suite.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: all deps build run test test-sanitize test-tsan bench bench-quick clean mcp-servers

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Builds only what it runs: the server and its CLI (the tests and benchmarks are `make build`'s).
run: deps $(BUILD)/build.ninja
	@cmake --build $(BUILD) -j $(JOBS) --target keel
	@bash scripts/run-demo.sh $(BUILD)/keel

# The tests run under scripts/with-pg.sh: a throwaway PostgreSQL for the PostgreSQL store's cases,
# stopped afterwards whatever the outcome (none is started when KEEL_TEST_PG_ADMIN_URL is set).
# The MCP tests run real servers from npm, installed once into a cache directory.
MCP_DIR ?= $(or $(KEEL_TEST_MCP_DIR),$(HOME)/.cache/keel-mcp-servers)

mcp-servers:
	@bash scripts/install-mcp-test-servers.sh $(MCP_DIR) || \
	  echo "make: could not install the MCP test servers; their tests will be skipped"

test: build mcp-servers
	KEEL_TEST_MCP_DIR=$(MCP_DIR) bash scripts/with-pg.sh ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 900

# The same suite built with AddressSanitizer and UndefinedBehaviorSanitizer, but for these
# integration tests on PostgreSQL: their server code is the same on both backends but for the
# store's, which the unit tests cover on PostgreSQL. `make test` runs them all.
ASAN_SKIP ?= ^integration_pg\.test_(api|anthropic|auth|bad_input|cards_attack|dashboard_auth|dashboard_browser|discord|fair|http_limits|matrix|mcp|mcp_conformance|mcp_server|openai|outbound|plugins|plugins_cli|poison|readme|roles|router|schedules|secrets|skills|slack|telegram|trust|usage_cli|users|users_attack|watchdog)$$
test-sanitize: deps mcp-servers
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKEEL_SANITIZE=ON -DKEEL_BENCH=OFF
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 KEEL_TEST_MCP_DIR=$(MCP_DIR) \
	  KEEL_CRASH_TURNS=120 KEEL_CRASH_KILLS=20 KEEL_CHAOS_TURNS=300 \
	  bash scripts/with-pg.sh ctest --test-dir build-asan --output-on-failure -j $(JOBS) --timeout 1200 \
	  -E '$(ASAN_SKIP)'

# The unit tests, and the integration tests that exercise threads most (the store's writer and
# readers, the tool pool, streams, several nodes), under ThreadSanitizer.
TSAN_INTEGRATION ?= ^integration\.test_(runtime|sse|approvals|mcp|schedules|fair|watchdog)$$|^integration_pg\.test_nodes$$
TSAN_ENV = TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	KEEL_TEST_MCP_DIR=$(MCP_DIR)
test-tsan: deps mcp-servers
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKEEL_TSAN=ON -DKEEL_BENCH=OFF
	cmake --build build-tsan -j $(JOBS)
	$(TSAN_ENV) bash scripts/with-pg.sh build-tsan/tests/keel_unit_tests --gtest_brief=1
	$(TSAN_ENV) bash scripts/with-pg.sh ctest --test-dir build-tsan --output-on-failure -j $(JOBS) \
	  --timeout 1200 -R '$(TSAN_INTEGRATION)'

bench: build
	@bash scripts/bench.sh $(BUILD)

# The guard (at most a minute): the end-to-end turn figures and the event-append ratio against
# bench/baseline.json; run it before landing a change to the runtime, store, gateway or API.
bench-quick: build
	@python3 bench/quick.py $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz

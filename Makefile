# Narad — every task of the repository. `make help` lists them.
#
# The Go workspace (go.work) has no root module, so Go targets loop over the modules.

GO          ?= go
GO_MODULES  := broker sdk-go sdk-go/otel sdk-go/prometheus examples conformance bench
# verify is linted, and tested by its own tiers (test-verify, chaos, soak), not under -race.
LINT_MODULES := $(GO_MODULES) verify
DURATION    ?= 30m
GEN_DIRS    := broker/internal/apigen sdk-go/api
BIN         := bin
NARAD       := $(BIN)/narad
BENCH_FLAGS ?=
FUZZTIME    ?= 20s

.DEFAULT_GOAL := help
.PHONY: help run build test test-go test-python test-js test-conformance test-verify test-docs test-examples test-console console console-screenshots docs check-gen gen lint fmt bench bench-go bench-storage bench-flow bench-scale bench-peers redis-server test-bench-peers bench-cluster bench-cluster-idle cluster \
        bench-raft bench-raft-idle bench-raft-failover bench-raft-throughput build-spike \
        fuzz e2e conformance examples chaos chaos-cluster soak clean audit test-audit release test-release

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

run: build ## Run a single node with embedded defaults (data in ./data, HTTP on 127.0.0.1:7942)
	$(NARAD) serve

build: ## Build the narad binary into bin/
	@mkdir -p $(BIN)
	cd broker && $(GO) build -o ../$(NARAD) ./cmd/narad

# The broker's tests mostly wait on real nodes (elections, leases, restarts), leaving
# much of the machine idle: the SDK suites and the conformance suite, which wait on
# nodes too, the console's browser tests and the docs build run beside them, in two
# lanes (BESIDE, BESIDE2).
test: check-gen lint ## Install what the tests need and run every test
	@$(MAKE) --no-print-directory test-go BESIDE="test-js test-conformance" BESIDE2="test-python test-docs test-console"
	@$(MAKE) --no-print-directory test-verify test-examples test-release
	@echo "make test: all suites passed"

# The broker's tests run in the background while the other modules' tests run, then
# the targets named in BESIDE; the targets named in BESIDE2 run beside those from the
# start (their output is printed when they end), and the broker's output is printed
# when it ends. The broker's tests wait on elections, leases and child processes far
# more than they compute (about a fifth of one core each), so four run at once in each
# package (-parallel 4; tests that set a package hook stay serial).
BESIDE ?=
BESIDE2 ?=
test-go: ## Go tests of every module, with the race detector (includes e2e against the binary)
	@mkdir -p $(BIN); log=$(abspath $(BIN))/test-go-broker.log; \
	echo "== go test broker (beside the other modules$(if $(BESIDE), and $(BESIDE) $(BESIDE2)); its output follows theirs)"; \
	(cd broker && $(GO) mod download && $(GO) test -race -count=1 -parallel 4 -timeout 10m ./...) > $$log 2>&1 & bpid=$$!; \
	fail=0; log2=$(abspath $(BIN))/test-beside2.log; p2=; \
	if [ -n "$(BESIDE2)" ]; then \
		if $(MAKE) --no-print-directory build >/dev/null; then \
			echo "== $(BESIDE2) (beside; their output follows when they end)"; \
			$(MAKE) --no-print-directory $(BESIDE2) > $$log2 2>&1 & p2=$$!; \
		else fail=1; fi; \
	fi; \
	for m in $(filter-out broker,$(GO_MODULES)); do \
		echo "== go test $$m"; \
		(cd $$m && $(GO) mod download && $(GO) test -race -count=1 -timeout 10m ./...) || fail=1; \
	done; \
	if [ $$fail = 0 ] && [ -n "$(BESIDE)" ]; then $(MAKE) --no-print-directory $(BESIDE) || fail=1; fi; \
	if [ -n "$$p2" ]; then \
		if wait $$p2; then echo "== $(BESIDE2): passed"; else echo "== $(BESIDE2): FAILED"; fail=1; fi; cat $$log2; fi; \
	if wait $$bpid; then echo "== go test broker: passed"; else echo "== go test broker: FAILED"; fail=1; fi; \
	cat $$log; exit $$fail

test-python: build ## Python SDK: venv, lint, mypy --strict, pytest against the built binary
	@if [ -f sdk-python/Makefile ]; then $(MAKE) -C sdk-python test NARAD_BIN=$(abspath $(NARAD)); \
	else echo "test-python: no Python SDK yet"; fi

test-js: build ## TypeScript SDK: npm ci, type checks, build, tests against the built binary
	@if [ -f sdk-js/Makefile ]; then $(MAKE) -C sdk-js test NARAD_BIN=$(abspath $(NARAD)); \
	else echo "test-js: no TypeScript SDK yet"; fi

test-console: build ## Web console: Biome lint, type checks, the embedded build matches its sources, browser tests in Debian's Chromium and Firefox ESR (installed if missing)
	$(MAKE) -C console test NARAD_BIN=$(abspath $(NARAD))

console: ## Rebuild the web console's embedded files from console/src (npm ci from the lock file)
	$(MAKE) -C console build

console-screenshots: build ## Refresh docs/assets/console from the console's browser test
	$(MAKE) -C console screenshots NARAD_BIN=$(abspath $(NARAD))

test-docs: ## Documentation builds with --strict and every relative link and anchor resolves
	$(MAKE) -C docs check

docs: ## Build the documentation site (mkdocs --strict) into site/
	$(MAKE) -C docs build

gen: ## Regenerate code from openapi.yaml (Go: oapi-codegen pinned in broker/go.mod; TS: openapi-typescript)
	@set -e; for d in $(GEN_DIRS); do (cd $$d && $(GO) generate ./...); done
	@if [ -f sdk-js/Makefile ]; then [ -d sdk-js/node_modules ] || $(MAKE) -C sdk-js deps; $(MAKE) -C sdk-js gen; fi

check-gen: ## Fail if the generated code differs from what openapi.yaml produces
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	for d in $(GEN_DIRS); do \
		out=$$(awk '/^output:/ {print $$2}' $$d/cfg.yaml); \
		spec=$$(sed -n 's/.*-config cfg.yaml \(.*\)$$/\1/p' $$d/generate.go); \
		sed "s|^output:.*|output: $$tmp/$$(basename $$d).go|" $$d/cfg.yaml > $$tmp/cfg.yaml; \
		(cd $$d && $(GO) tool oapi-codegen -config $$tmp/cfg.yaml $$spec); \
		if ! cmp -s $$tmp/$$(basename $$d).go $$d/$$out; then \
			echo "check-gen: $$d/$$out is stale; run 'make gen' and commit the result"; \
			diff -u $$d/$$out $$tmp/$$(basename $$d).go | head -40; exit 1; \
		fi; \
	done; echo "check-gen: generated code matches openapi.yaml"

# Every Go module, each checked on its own (GOWORK=off) so none builds only inside go.work.
# bench/peers is outside the workspace, so the broker never sees NATS or Redis; tools pins
# the linters and is outside it too.
TIDY_MODULES := $(LINT_MODULES) bench/peers tools tools/release
LINT_BIN     := $(abspath $(BIN))/lint

lint: ## Go: tidy, vet, gofmt, staticcheck, errcheck per module; Python: ruff, mypy --strict; TS: tsc strict, Biome
	@set -e; GOWORK=off $(GO) -C tools build -o $(LINT_BIN)/ honnef.co/go/tools/cmd/staticcheck github.com/kisielk/errcheck; \
	for m in $(TIDY_MODULES); do \
		echo "== lint $$m"; \
		(cd $$m && GOWORK=off $(GO) mod tidy -diff) || { echo "lint: $$m/go.mod or go.sum is not tidy; run 'cd $$m && GOWORK=off go mod tidy'"; exit 1; }; \
		(cd $$m && GOWORK=off $(GO) vet ./...); \
		(cd $$m && GOWORK=off $(LINT_BIN)/staticcheck ./...); \
		(cd $$m && GOWORK=off $(LINT_BIN)/errcheck -ignoretests -exclude $(abspath tools/errcheck_excludes.txt) ./...); \
	done
	@bad=$$(gofmt -l $(TIDY_MODULES)); if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	@# Python: ruff and mypy --strict over the SDK (its Makefile makes the venv) and the examples.
	$(MAKE) -C sdk-python lint typecheck
	$(MAKE) -C examples lint-python
	@# TypeScript: tsc strict over the sources, then Biome.
	@[ -d sdk-js/node_modules ] || $(MAKE) -C sdk-js deps
	$(MAKE) -C sdk-js typecheck lint

# A release's version: VERSION=…, else the latest tag, else 0.0.0-<short commit>.
VERSION ?= $(shell git describe --tags --abbrev=0 2>/dev/null || echo 0.0.0-$$(git rev-parse --short HEAD))

release: ## Static binaries (linux, darwin x amd64, arm64), SBOMs, SHA256SUMS, an OCI image and a Homebrew formula into dist/
	cd tools/release && GOWORK=off $(GO) run . -version $(VERSION) -commit $$(git rev-parse HEAD) \
		-date $$(git log -1 --format=%cI) -broker ../../broker -out ../../dist

test-release: ## Tests of make release: the image's config from stand-in binaries, and a release for this machine
	cd tools/release && GOWORK=off $(GO) test -count=1 ./...

audit: ## Known vulnerabilities: govulncheck over every Go module, npm audit (sdk-js), pip-audit (sdk-python); offline, says so and passes
	@GOWORK=off $(GO) -C tools build -o $(LINT_BIN)/ golang.org/x/vuln/cmd/govulncheck
	@[ -x sdk-python/.venv/bin/python ] || $(MAKE) -s -C sdk-python venv
	@GOVULNCHECK=$(LINT_BIN)/govulncheck GO_MODULES="$(LINT_MODULES)" tools/audit.sh

test-audit: ## Test make audit's script with stand-in tools: offline it skips in one line per tool and passes, a finding fails
	tools/audit_test.sh

fmt: ## gofmt every module
	gofmt -w $(TIDY_MODULES)

bench: bench-go bench-flow ## Go benchmarks (storage, queue, broker, HTTP handlers), then every workload shape against a node

bench-go: bench-storage ## Go benchmarks of the queue logic, the broker's batched flow and the HTTP handlers, after the storage ones
	cd broker && $(GO) test -run '^$$' -bench . -benchtime 1s ./internal/queue ./internal/broker ./internal/httpapi

bench-storage: ## Segment log: durable appends/s and MB/s beside the machine's fsync rate
	cd broker && $(GO) test -run '^$$' -bench . -benchtime 2s ./internal/storage/segment

bench-scale: build ## Minutes and ~13 GB of disk: RSS with 10M messages of backlog, restart over 10 GiB of log
	cd broker && $(GO) test -tags scale -count=1 -timeout 60m -run TestScale -v ./e2e/

bench-flow: build ## Every workload shape over HTTP against a fresh node: a table of throughput, latency, loss, CPU, RSS
	cd bench && $(GO) run ./cmd/narad-bench --narad ../$(NARAD) $(BENCH_FLAGS)

bench-peers: build redis-server ## The same shapes against narad, NATS JetStream (default sync, sync always, R3 sync always) and Redis Streams, with ratios
	cd bench/peers && GOWORK=off $(GO) run ./cmd/narad-bench-peers --narad ../../$(NARAD) $(BENCH_FLAGS)

# Redis Streams is bench-peers' single-node peer (appendfsync always). Debian's
# redis-server is installed when none is on PATH and REDIS_SERVER is unset; where it
# cannot be (not root, no package source) the peers run without it and say so.
redis-server: ## Install Debian's redis-server for bench-peers when none is found
	@if [ -z "$$REDIS_SERVER" ] && ! command -v redis-server >/dev/null; then \
		echo "installing Debian's redis-server for bench-peers"; \
		apt-get install -y redis-server >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y redis-server >/dev/null 2>&1; } || \
		echo "redis-server could not be installed: bench-peers runs without Redis"; \
	fi

bench-cluster: build ## Cluster: forwarded vs local latency on 3 nodes, then produce, flow, batch on 1 node and on 3 (replication_factor 3)
	cd bench && $(GO) run ./cmd/narad-bench --narad ../$(NARAD) --cluster 3 --mode produce,flow,batch $(BENCH_FLAGS)

build-spike: ## Build the replication spike's node (broker/cmd/narad-spike) into bin/
	@mkdir -p $(BIN)
	cd broker && $(GO) build -o ../$(BIN)/narad-spike ./cmd/narad-spike

RAFT_FLAGS ?=
bench-raft: build-spike ## Replication spike, ~6 min: 300 raft groups x RF 3 on 3 processes: idle cost, failover after kill -9, RF 3 throughput
	cd bench && $(GO) run ./cmd/narad-raft-bench --spike ../$(BIN)/narad-spike --mode idle,failover,throughput $(RAFT_FLAGS)

bench-raft-idle: build-spike ## Replication spike: CPU and RSS of 300 x RF 3 groups idle for 60 s after one write each
	cd bench && $(GO) run ./cmd/narad-raft-bench --spike ../$(BIN)/narad-spike --mode idle $(RAFT_FLAGS)

bench-raft-failover: build-spike ## Replication spike: kill -9 a partition's leader 20 times; time to the first 202 on it
	cd bench && $(GO) run ./cmd/narad-raft-bench --spike ../$(BIN)/narad-spike --mode failover $(RAFT_FLAGS)

bench-raft-throughput: build-spike ## Replication spike: RF 3 produce, flow and batch rates with p50/p99
	cd bench && $(GO) run ./cmd/narad-raft-bench --spike ../$(BIN)/narad-spike --mode throughput $(RAFT_FLAGS)

test-bench-peers: redis-server ## Tests of bench/peers (outside the workspace): builds nats-server and runs each shape briefly
	cd bench/peers && GOWORK=off $(GO) test -race -count=1 ./...

fuzz: ## Run every fuzz target for FUZZTIME each
	@set -e; cd broker; for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; done

e2e: ## Only the end-to-end tests against the real binary, with the slower cluster ones (tag cluster)
	cd broker && $(GO) test -race -count=1 -tags cluster -timeout 20m ./e2e/...

bench-cluster-idle: ## CPU of an idle 3-node cluster over 60 s, then with 300 idle partitions x RF 3, and the controller failover time (5 rounds)
	cd broker && $(GO) test -count=1 -tags cluster -v -run 'TestClusterIdleCPU|TestReplicatedIdleCPU|TestClusterFailoverTimes|TestReplicationFailoverTimes' ./e2e/ | grep -E 'idle 3-node|idle replicated|controller change|partition failover|^(--- |ok|FAIL)'

CLUSTER_SECRET ?= local-cluster-secret-not-for-production
cluster: build ## Run a 3-node cluster on loopback (HTTP 7951-7953, cluster UDP 7961-7963, data in ./data-cluster) until Ctrl-C
	@mkdir -p data-cluster; \
	peers=n1@127.0.0.1:7961,n2@127.0.0.1:7962,n3@127.0.0.1:7963; pids=; \
	trap 'kill $$pids 2>/dev/null; wait $$pids 2>/dev/null; echo; echo "cluster stopped"' INT TERM EXIT; \
	for i in 1 2 3; do \
		NARAD_CLUSTER_SECRET=$(CLUSTER_SECRET) $(NARAD) serve --node-id n$$i --http-addr 127.0.0.1:795$$i \
			--cluster-addr 127.0.0.1:796$$i --peers $$peers --data-dir data-cluster/n$$i \
			> data-cluster/n$$i.log 2>&1 & pids="$$pids $$!"; \
	done; \
	echo "3 nodes: http://127.0.0.1:7951 7952 7953 (logs: data-cluster/n*.log); Ctrl-C stops them"; \
	wait

conformance: test-conformance ## SDK conformance suite: both tiers, every SDK

test-conformance: build ## SDK conformance: wire tier (scripted server) and behaviour tier (real node), every driver; behaviour tier again on a 3-node cluster
	$(MAKE) -C conformance test NARAD_BIN=$(abspath $(NARAD))
	$(MAKE) -C conformance behaviour-cluster NARAD_BIN=$(abspath $(NARAD))

examples: build ## Runnable examples against a node the harness starts (every step)
	$(MAKE) -C examples all NARAD_BIN=$(abspath $(NARAD))

test-examples: build ## Examples: lint, then a quick run of each against the built binary
	$(MAKE) -C examples test NARAD_BIN=$(abspath $(NARAD))

test-verify: ## Kill loop (>= 20 kill -9, half at failpoints) and a 3-node cluster chaos run (>= 8 kill -9, SIGSTOPs, a network cut) checked by the history checker, a quiet cluster run (exactly once), disk-full and corruption scenarios, short schemathesis
	$(MAKE) -C verify test

MOVE_PARTIES ?= controller leader source target
MOVE_PHASES ?= copying switching
POWERLOSS_RUNS ?= 20
chaos-cluster: ## About 1 h 20 min, as root: 10 seeds of 5 nodes in network namespaces under every cluster fault (iptables cuts, deaf and mute leaders, splits, loss; kills, pauses, wipes, kill-all, damaged files, clock skew, moves with a party killed, under the checker), then POWERLOSS_RUNS in-process power losses of a whole 3-node cluster (3 cuts each), then a partition move under load with each party killed at each phase, then the slower membership tests (tag cluster)
	$(MAKE) -C verify chaos-cluster-netns
	cd broker && $(GO) test -count=$(POWERLOSS_RUNS) -timeout 20m -run '^TestReplicatedPowerLoss$$' ./internal/partition/
	@set -e; for party in $(MOVE_PARTIES); do for phase in $(MOVE_PHASES); do \
		echo "== move: kill the $$party while $$phase"; \
		(cd broker && NARAD_MOVE_PARTY=$$party NARAD_MOVE_PHASE=$$phase $(GO) test -count=1 -tags cluster -timeout 10m -run '^TestClusterMoveSurvivesAKill$$' ./e2e/); \
	done; done
	cd broker && $(GO) test -count=1 -tags cluster -timeout 20m -run 'TestClusterReplicationFactorFromOne|TestClusterJoinRebalanceAndReplace' ./e2e/

chaos: ## About 2 h 40 min: kill loops with disk faults over 10 seeds, every fuzz target for 10 minutes, full schemathesis
	$(MAKE) -C verify chaos

soak: ## DURATION (make soak DURATION=2h) on a 3-node cluster: plain, batch, delayed, fan-out and replayed messages, a rolling restart every few minutes, a report every hour and at the end
	$(MAKE) -C verify soak DURATION=$(DURATION)

clean: ## Remove build output and the local data dir of `make run`
	rm -rf $(BIN) data dist
	$(MAKE) -C verify clean

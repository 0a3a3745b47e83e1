# stockgate: `make run` to try it, `make test` to test everything.
SHELL := /bin/bash
RUN_DIR := .run
GO ?= go
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test-unit run stop test test-side test-short lint bench bench-faults compare fuzz dashboard deps-redis deps-postgres deps-pgbouncer deps-autofailover deps-promtool deps-chromium deps-lint deps-golangci-lint deps-helm deps-kubeconform deps-schemas build vet release

build:
	$(GO) build -o $(RUN_DIR)/stockgate ./cmd/stockgate

# Installs redis-server (with redis-cli) when it is missing.
deps-redis:
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { \
	  echo "make: redis-server not found; installing it with apt-get"; \
	  $(SUDO) apt-get update -q && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server redis-tools; }

# Installs the PostgreSQL server binaries when they are missing. The tests
# start their own throwaway server from them; nothing is left running.
deps-postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || [ -n "$$STOCKGATE_TEST_DATABASE_URL" ] || { \
	  echo "make: PostgreSQL server binaries not found; installing postgresql with apt-get"; \
	  $(SUDO) apt-get update -q && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; }

# Installs PgBouncer when it is missing: the ledger tests run it in
# transaction pooling mode in front of their throwaway PostgreSQL (Debian
# puts it in /usr/sbin). The package starts no server here.
deps-pgbouncer:
	@command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || { \
	  echo "make: pgbouncer not found; installing it with apt-get"; \
	  $(SUDO) apt-get update -q && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer; }

# Installs pg_auto_failover for the installed PostgreSQL when it is
# missing: the failover tests run its monitor and two keepers (a primary
# and a synchronous standby) as throwaway processes; nothing stays running.
deps-autofailover: deps-postgres
	@v=$$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1); \
	  command -v pg_autoctl >/dev/null && [ -e /usr/lib/postgresql/$$v/lib/pgautofailover.so ] || { \
	  echo "make: pg_auto_failover not found; installing it with apt-get"; \
	  $(SUDO) apt-get update -q && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends pg-auto-failover-cli postgresql-$$v-auto-failover; }

# Installs promtool (Debian's prometheus package ships it) when it is
# missing; the deploy tests check the alert rules with it. The package does
# not start a Prometheus server here (no init system), and tests start none.
deps-promtool:
	@command -v promtool >/dev/null || { \
	  echo "make: promtool not found; installing prometheus (for promtool) with apt-get"; \
	  $(SUDO) apt-get update -q && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }

# Installs the pinned npm tools of deploy/lint (Redocly CLI, which lints
# the OpenAPI document) with npm ci, and Node.js with apt-get when it is
# missing. Again only when the lock file changed.
deps-lint:
	@command -v npm >/dev/null || { \
	  echo "make: npm not found; installing nodejs and npm with apt-get"; \
	  $(SUDO) apt-get update -q && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm; }
	@[ deploy/lint/node_modules/.package-lock.json -nt deploy/lint/package-lock.json ] || \
	  (cd deploy/lint && npm ci --no-audit --no-fund --loglevel=error)

# The chart's checkers, built from the Go module proxy into Go's bin
# directory when missing or of another version: helm (lint --strict,
# template) and kubeconform; and the modules whose files the schemas are
# made from (Kubernetes' OpenAPI document, the Prometheus Operator's and
# KEDA's CRDs: see deploy/checkers_test.go). The first build of helm takes
# about a minute; afterwards each is a version check.
HELM_VERSION := v3.19.0
KUBECONFORM_VERSION := v0.8.0
GOBIN_DIR = $(shell $(GO) env GOBIN | grep . || echo "$$($(GO) env GOPATH)/bin")
deps-helm:
	@$(GO) version -m "$(GOBIN_DIR)/helm" 2>/dev/null | grep -qP '^\tmod\thelm.sh/helm/v3\t$(HELM_VERSION)\t' || { \
	  echo "make: installing helm $(HELM_VERSION) with go install"; \
	  $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION); }

# golangci-lint, pinned, built from the Go module proxy into Go's bin
# directory like helm above (the first build takes about a minute).
GOLANGCI_LINT_VERSION := v2.15.0
deps-golangci-lint:
	@$(GO) version -m "$(GOBIN_DIR)/golangci-lint" 2>/dev/null | grep -qP '^\tmod\tgithub.com/golangci/golangci-lint/v2\t$(GOLANGCI_LINT_VERSION)\t' || { \
	  echo "make: installing golangci-lint $(GOLANGCI_LINT_VERSION) with go install"; \
	  $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION); }

deps-kubeconform:
	@$(GO) version -m "$(GOBIN_DIR)/kubeconform" 2>/dev/null | grep -qP '^\tmod\tgithub.com/yannh/kubeconform\t$(KUBECONFORM_VERSION)\t' || { \
	  echo "make: installing kubeconform $(KUBECONFORM_VERSION) with go install"; \
	  $(GO) install github.com/yannh/kubeconform/cmd/kubeconform@$(KUBECONFORM_VERSION); }

deps-schemas:
	@d=$$(mktemp -d) && cd $$d && GOFLAGS=-mod=mod $(GO) mod download k8s.io/kubernetes@v1.34.1 \
	  github.com/prometheus-operator/prometheus-operator@v0.81.0 github.com/kedacore/keda/v2@v2.17.2; \
	  rc=$$?; rmdir $$d; exit $$rc

# A local 3-master + 3-replica Redis Cluster on 127.0.0.1:7000-7005 and the
# gateway on 127.0.0.1:8080 (admin routes open: loopback only) with the
# SQLite ledger in .run/, both in the background.
run: deps-redis build
	@RUN_DIR=$(RUN_DIR) deploy/local/cluster.sh start
	@if [ -f $(RUN_DIR)/stockgate.pid ] && kill -0 $$(cat $(RUN_DIR)/stockgate.pid) 2>/dev/null; then \
	  echo "stockgate already running (pid $$(cat $(RUN_DIR)/stockgate.pid))"; \
	else \
	  STOCKGATE_ADDR=127.0.0.1:8080 STOCKGATE_LEDGER_DSN=$(RUN_DIR)/ledger.db $(RUN_DIR)/stockgate serve >>$(RUN_DIR)/stockgate.log 2>&1 & \
	  echo $$! > $(RUN_DIR)/stockgate.pid; \
	fi
	@for i in $$(seq 100); do curl -fsS localhost:8080/readyz >/dev/null 2>&1 && break; sleep 0.1; done
	@curl -fsS localhost:8080/readyz >/dev/null || { echo "stockgate did not start; see $(RUN_DIR)/stockgate.log"; tail -5 $(RUN_DIR)/stockgate.log; exit 1; }
	@echo "stockgate ready on :8080 (pid $$(cat $(RUN_DIR)/stockgate.pid)), log in $(RUN_DIR)/stockgate.log. Try:"
	@echo "  curl -X PUT localhost:8080/v1/admin/skus/show-1/ga --json '{\"total\":100,\"shards\":8,\"max_per_order\":4}'"
	@echo "  curl localhost:8080/v1/skus/show-1/ga/purchases -H 'Idempotency-Key: order-1' --json '{\"buyer\":\"alice\",\"quantity\":2}'"
	@echo "  curl localhost:8080/v1/skus/show-1/ga/stock"
	@echo "make stop stops both."

stop:
	@if [ -f $(RUN_DIR)/stockgate.pid ]; then \
	  pid=$$(cat $(RUN_DIR)/stockgate.pid); kill $$pid 2>/dev/null && echo "stopped stockgate (pid $$pid)"; \
	  for i in $$(seq 50); do kill -0 $$pid 2>/dev/null || break; sleep 0.1; done; \
	  rm -f $(RUN_DIR)/stockgate.pid; fi
	@RUN_DIR=$(RUN_DIR) deploy/local/cluster.sh stop

# Installs Debian's Chromium when it is missing (headless, for pictures and
# browser tests).
deps-chromium:
	@command -v chromium >/dev/null || { \
	  echo "make: chromium not found; installing it with apt-get"; \
	  $(SUDO) apt-get update -q && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

# docs/dashboard.png: the chart's Grafana dashboard, every panel's query
# answered by a real Prometheus scrape of `make run` under load (about 3
# minutes), drawn by deploy/local/dashshot (Grafana is not installable here).
dashboard: run deps-promtool deps-chromium
	@RUN_DIR=$(RUN_DIR) deploy/local/dashboard.sh

vet:
	$(GO) vet $(PKGS)
	cd client && $(GO) vet ./...

# The packages of the server's module and of the modules the workspace
# (go.work) holds beside it for the tests and the load tool: ./... at the
# root stops at a nested module, so each is named.
PKGS := ./... ./e2e/... ./deploy/... ./cmd/stockbench/...
# The linters of .golangci.yml (go vet's analyzers among them) over both
# modules: about 400 s on 2 cores with a cold cache, 4 s warm.
# GOFLAGS=-trimpath: the packages golangci-lint has go list compile, and
# so its analysis cache, are then the same for a checkout of this tree at
# any path (measured: 3.7 s at a second path after one run here, 264 s
# without it).
lint: deps-golangci-lint
	GOFLAGS=-trimpath $(GOBIN_DIR)/golangci-lint run $(PKGS)
	cd client && GOFLAGS=-trimpath $(GOBIN_DIR)/golangci-lint run ./...
	cd tools/release && GOWORK=off GOFLAGS=-trimpath $(GOBIN_DIR)/golangci-lint run ./...

# The slowest packages, named first so that go test starts them first and
# none of them runs alone at the end.
SLOW_PKGS := ./e2e/failover ./ledger ./e2e/purchase ./e2e/faults ./e2e/shed ./e2e/holds ./e2e/model ./deploy ./relay ./cmd/stockgate
# Packages that run alone, one after the other, once the others are done:
# - e2e/nodefaults holds Redis faults to a share of 503s at a third of
#   the capacity it measures first, and beside two other packages that
#   capacity moved under it (45 purchases/s measured, a reshard that took
#   82 s instead of 9 alone; 7 % and 33 % 503s against 1 % and 0.1 %).
#   Alone: 50 s for those two tests.
# - e2e/waitroom times admission windows of a few seconds and joins a
#   second from one network: with both cores 90-99 % busy beside
#   e2e/faults and e2e/model (2026-12-02), 114 of 120 admitted buyers
#   let a 6 s window pass unseen, and 100 joins took longer than the
#   10 s the proof-of-work meter counts over (4 tests failed); alone
#   they pass.
ALONE_PKGS := ./e2e/nodefaults ./e2e/waitroom

# Everything, with the race detector, against real servers the tests start:
# the linters first (go vet's analyzers among them); then every package as
# its own process, the whole-system tests split by capability under e2e/;
# then a short run of each fuzz target (their seed inputs already ran
# above). Three packages at a time, not go test's default of one per CPU:
# the tests mostly wait on servers and timers (two at a time kept 2 cores
# half busy), and go test -race ./... took 6m17s with three, 11m35s with
# two. The run is CPU-bound now (both cores 93-100 % busy throughout):
# about 20 minutes of go test on 2 cores, see docs/TESTING.md. go test's
# own vet pass is off (-vet=off): lint ran govet's analyzers, a superset
# of it, just before. The packages' timeout (a hang's guard) is 20
# minutes: e2e/faults took 615 s alone and 800-900 s beside the others
# (2026-12-04), and at 15 minutes a loaded run timed it out while it was
# still passing. It is three packages since 2026-12-05 (alone: 514 s,
# now e2e/failover 228, e2e/faults 157, e2e/shed 128), so no one package
# is the lane's long pole.
# -race turns on -d=checkptr everywhere; in modernc.org's SQLite (C
# translated to Go, pointer arithmetic on every row) that check was a
# fifth of the CPU of a SQLite model run (TestModelConcurrent/sqlite, 1,000
# operations: 16.0 s of samples with it, 12.8 s without). It stays on for
# every other package, and the race detector stays on for all of them.
RACE := -race -gcflags=modernc.org/...=-d=checkptr=0
# -trimpath keeps absolute paths out of every build action, so what one
# checkout compiled and linked (the race build of all ~70 test binaries,
# about 1,050 CPU-seconds from an empty cache, 150 warm) is reused by a
# checkout of the same tree at another path, as CI's is.
TRIM := -trimpath
# No DWARF in the test binaries (-w): make test links about 70 of them,
# each with the race runtime, and DWARF was a quarter of a link's CPU
# (an e2e binary: 7.5 CPU-s with it, 5.8 without). Stack traces and race
# reports symbolize from the Go symbol table, which stays.
TESTLD := -ldflags=-w

# The side lane runs beside the packages: the client module, the release
# tool (a minute, mostly gzip of the image layers under -race) and the
# short fuzz runs. The packages leave about a tenth of 2 cores idle (1,343
# CPU-s in 748 s, 2026-12-02), which they fill; one after the other at
# the end they were 3 minutes (4 s, 125 s, 46 s). Its output is printed
# whole when the packages are done, and its failure fails the run.
test: lint deps-redis deps-postgres deps-pgbouncer deps-autofailover deps-promtool deps-chromium deps-lint deps-helm deps-kubeconform deps-schemas
	@mkdir -p .run; rm -f .run/test-side.log
	@$(MAKE) --no-print-directory test-side > .run/test-side.log 2>&1 & side=$$!; \
	$(GO) test $(RACE) $(TRIM) $(TESTLD) -vet=off -count=1 -timeout 20m -p 3 $(SLOW_PKGS) $(shell $(GO) list $(PKGS) | grep -v -e '/e2e/nodefaults$$' -e '/e2e/waitroom$$'); rc=$$?; \
	wait $$side; side_rc=$$?; echo "--- the side lane (.run/test-side.log):"; cat .run/test-side.log; \
	test $$rc -eq 0 && test $$side_rc -eq 0
	$(GO) test $(RACE) $(TRIM) $(TESTLD) -vet=off -count=1 -timeout 15m -p 1 $(ALONE_PKGS)

# The release test builds the gateway for two platforms, twice: 71 s
# with the build cache warm, past go test's default 10 minutes with it
# cold beside the packages (2026-12-03, a new machine).
test-side:
	cd client && $(GO) test -race $(TRIM) $(TESTLD) -count=1 ./...
	cd tools/release && GOWORK=off $(GO) test -race $(TRIM) $(TESTLD) -count=1 -timeout 20m ./...
	@$(MAKE) --no-print-directory fuzz FUZZTIME=500x

# The unit tier: no server starts and nothing is installed. testenv skips
# every test that needs Redis, PostgreSQL, PgBouncer or a proxy in front
# of one (STOCKGATE_TEST_TIER=unit; make test never sets it, so nothing is
# skipped in CI). e2e/ and deploy/ are whole-system and build tests and
# are not in it.
UNIT_PKGS = $(shell $(GO) list ./... ./cmd/stockbench)
test-unit:
	STOCKGATE_TEST_TIER=unit $(GO) test -short $(TRIM) $(TESTLD) -count=1 $(UNIT_PKGS)
	cd client && $(GO) test -short $(TRIM) -count=1 ./...

# The fast tier, about 2 minutes on 2 cores (2m00s-2m09s measured, build
# cache warm): every package with -short and without the race detector.
# Model runs, attacks and fault runs skip themselves (systest.FullTier);
# what is left mostly waits on servers and timers, so four packages run at
# a time.
test-short: deps-redis deps-postgres deps-pgbouncer deps-promtool deps-chromium deps-lint deps-helm deps-kubeconform deps-schemas
	$(GO) test -short $(TRIM) -count=1 -p 4 $(SLOW_PKGS) $(ALONE_PKGS) $(PKGS)
	cd client && $(GO) test -short $(TRIM) -count=1 ./...

# The flash sale and the sold-out storm through the build at BASE and the
# working tree, side by side in interleaved rounds (about 5 minutes).
BASE ?= HEAD~1
compare: deps-redis deps-postgres
	$(GO) run ./cmd/stockbench compare -base $(BASE)

# Each fuzz target for FUZZTIME inputs (default 200000x): request parsing,
# and every stock script's argument parsing against a real Redis Cluster.
# Counts, not durations: Go 1.26's fuzz coordinator can fail a run at the
# end of a -fuzztime duration with "context deadline exceeded" and no
# crasher (golang/go#75804, fixed in Go 1.27).
FUZZTIME ?= 200000x
FUZZ_TARGETS := gateway:FuzzDecodePurchase shard:FuzzDeductArgs gateway:FuzzIdempotencyKey shard:FuzzRefillArgs shard:FuzzSeedArgs shard:FuzzScriptReplies
# Two targets at a time (each fuzzes with one worker: one core each),
# each target's output printed whole when it ends. The two packages
# alternate, so the first two build their instrumented binaries side by
# side and the rest find them built, not two builds of one package at once.
fuzz: deps-redis
	@printf '%s\n' $(FUZZ_TARGETS) | xargs -P 2 -n 1 sh -c '\
	  pkg=$${1%%:*}; name=$${1#*:}; \
	  out=$$($(GO) test $(TRIM) -run "^$$" -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -parallel 1 ./$$pkg 2>&1); rc=$$?; \
	  printf "fuzz %s %s for %s\n%s\n" "$$pkg" "$$name" "$(FUZZTIME)" "$$out"; exit $$rc' _

# The side-by-side benchmark: its own Redis Cluster and PostgreSQL,
# stockgate as its own process, the comparators; writes docs/BENCHMARKS.md
# (about 10 minutes on 2 cores). Charts land in .run/bench/.
bench: deps-redis deps-postgres deps-chromium
	$(GO) run ./cmd/stockbench suite -out docs/BENCHMARKS.md

# The release artifacts under dist/, built without a container daemon
# (tools/release): the image for linux/amd64 and linux/arm64 as an OCI
# layout (dist/image, its index digest in dist/image.digest; push it with
# crane, skopeo or oras) and the chart packaged with that digest as its
# image. VERSION defaults to the tag on HEAD; every time in the image is
# the commit's, so one commit builds one digest.
VERSION ?= $(shell git describe --tags --exact-match --match 'v*' 2>/dev/null || echo v0.0.0-$$(git rev-parse --short=12 HEAD))
release: deps-helm
	cd tools/release && GOWORK=off $(GO) run . -repo ../.. -out ../../dist -version $(VERSION) \
	  -revision $$(git rev-parse HEAD) -epoch $$(git log -1 --format=%ct) -helm $(GOBIN_DIR)/helm

# The faults of a sale against a stockgate process, each on servers of its
# own: four of Redis (kill -9 of a master, all of Redis down, a live
# reshard, a zombie master), two of the ledger's link (500 ms slower, cut
# for 10 s, through toxiproxy) and three of its primary (a planned failover,
# a postmaster killed, a node lost, on a pg_auto_failover formation);
# writes its section of docs/BENCHMARKS.md (about 10 minutes), which `make
# bench` keeps.
bench-faults: deps-redis deps-postgres deps-autofailover
	$(GO) run ./cmd/stockbench faults -out docs/BENCHMARKS.md

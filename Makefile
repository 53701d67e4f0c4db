# kvrouterd — build, test, benchmark and fuzz. `make test` is what CI runs (.ci/run).

GO        ?= go
FUZZTIME  ?= 30s
# Timing benchmarks run this many times; the report gives medians (benchstat).
BENCHCOUNT ?= 6
BENCHSTAT  := golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
OUT        := bench/out

.PHONY: build run test test-cluster vet image bench bench-quick demo micro micro-ab frontdoor-overhead load load-1cpu soak fuzz clean traces stream

build:
	$(GO) build ./...

# The daemon with its embedded defaults (HTTP on :8090, data in ./data). ARGS adds flags.
# Built first, with a word that it is: the first build compiles about 50 modules (the C of a
# zstd library among them), which takes minutes on 2 cores; -v names each package as it goes.
run:
	@echo "building kvrouterd into bin/ (the first build compiles about 50 modules: minutes on 2 cores; later ones take seconds)..."
	$(GO) build -v -o bin/kvrouterd ./cmd/kvrouterd
	@echo "starting bin/kvrouterd $(ARGS)"
	./bin/kvrouterd $(ARGS)

# The container image (deploy/Dockerfile; its binary built by deploy/build.sh, which the
# deploy package's tests run), tagged $(IMAGE):$(IMAGE_VERSION) and $(IMAGE):latest, with docker
# (its engine running) or podman; without either it says so and fails.
IMAGE         ?= kvrouterd
IMAGE_VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
image:
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then engine=docker; \
	elif command -v podman >/dev/null 2>&1; then engine=podman; \
	else echo "make image: needs docker with a running engine, or podman; neither is available here." \
		"deploy/build.sh OUT builds the image's binary without them." >&2; exit 1; fi; \
	echo "$$engine build $(IMAGE):$(IMAGE_VERSION)"; \
	$$engine build -f deploy/Dockerfile --build-arg VERSION=$(IMAGE_VERSION) \
		-t $(IMAGE):$(IMAGE_VERSION) -t $(IMAGE):latest .

vet:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The suite: unit, differential and concurrent tests (also under the race detector), tests that
# need the invariants tag (hooks that stop a reader mid-lookup), the fuzz targets' seed corpora,
# and every benchmark once at small sizes so that none rots. The three test passes run through
# internal/testsum, which prints what go test prints and keeps every skip: the last lines list
# each test that skipped (a program not installed, the race detector) and why.
TESTSUM := bin/testsum --skips $(OUT)/test-skips.txt
test: vet
	@mkdir -p bin $(OUT) && rm -f $(OUT)/test-skips.txt && $(GO) build -o bin/testsum ./internal/testsum
	$(TESTSUM) $(GO) test -count=1 ./...
	$(TESTSUM) $(GO) test -race -count=1 ./...
	$(TESTSUM) $(GO) test -count=1 -tags invariants ./...
	$(GO) test -count=1 -short -run '^$$' -bench . -benchtime=1x ./...
	@bin/testsum --summary $(OUT)/test-skips.txt

# Two replicas on a three-node NATS cluster at length (nats-server, Debian package nats-server):
# more events than the short version in `make test`, each node and each replica killed in turn,
# a node once while a replica is down; then the client's consumer on a cluster losing a node.
test-cluster:
	@command -v nats-server >/dev/null || { echo "make test-cluster needs nats-server (Debian: apt-get install nats-server)"; exit 1; }
	KVR_TEST_CLUSTER=long $(GO) test -count=1 -v -timeout 20m -run 'TestDaemonNATSCluster|TestConsumerClusterFailover' ./cmd/kvrouterd/ ./ingest/

# The performance and routing-quality report: bench/out/report.md, report.json and PNG plots
# (under 10 minutes on 2 cores; bench-quick under 2).
bench:
	$(GO) run ./bench/report --out $(OUT) $(ARGS)

bench-quick:
	$(GO) run ./bench/report --quick --out $(OUT) $(ARGS)

# A long generated trace (REQUESTS requests in Mooncake's form, $(OUT)/gen.jsonl, about 210
# bytes a request) replayed streamed in kv mode: the table, and the replay's peak RSS, which
# stays bounded whatever the trace's length (about 10 minutes for the default 10 M on 2 cores).
REQUESTS ?= 10000000
stream:
	@mkdir -p $(OUT)
	$(GO) run ./bench/tracegen --requests $(REQUESTS) > $(OUT)/gen.jsonl
	$(GO) run ./bench/fleetsim --stream --trace $(OUT)/gen.jsonl --modes kv $(ARGS)

# The public traces the report replays, from their published sources, checked against pinned
# SHA-256 sums, into TRACES (the report finds ./traces by itself; needs curl or wget and the
# network).
TRACES ?= traces
traces:
	sh bench/fetch-traces.sh $(TRACES)

# kvrouterd with its front door and four mock engines, a workload through the front door in kv
# mode, with Dynamo's cost and round robin: TTFT and ITL of each, beside the simulator's (about
# three minutes on 2 cores). The workload is the Mooncake conversation trace when ./traces has it
# (`make traces`), else the built-in generated one. ARGS adds flags (`--help` lists them).
demo:
	$(GO) run ./bench/demo --out $(OUT) $(ARGS)

# Microbenchmarks, BENCHCOUNT runs each, summarized as medians; memory benchmarks once (they do
# not depend on timing). Raw output in bench/out/.
micro:
	mkdir -p $(OUT)
	$(GO) test -run '^$$' -bench 'HashBlocks|IndexMatch|ShardApply|ApplierApply|MatchUnderLoad|^BenchmarkRoute$$|^BenchmarkRouteCold$$|HandleRouteParallel|RouteRequestDecode|RouteResponseEncode|DecodeEngineBatch' -count $(BENCHCOUNT) ./radix/ ./shard/ ./router/ ./server/ ./wire/ | tee $(OUT)/micro.txt
	$(GO) test -run '^$$' -bench 'ShardMemory|VsXsync|VsBuiltin' -benchtime 1x ./radix/ ./shard/ ./internal/u64map/ | tee $(OUT)/memory.txt
	$(GO) test -run '^$$' -bench 'Memory' -count 3 ./internal/prefetch/ | tee $(OUT)/prefetch.txt
	$(GO) run $(BENCHSTAT) $(OUT)/micro.txt | tee $(OUT)/micro-medians.txt
	$(GO) test -run '^$$' -bench 'NATSIngest|ZMQIngest' -benchtime 3000x -count $(BENCHCOUNT) ./ingest/ | tee $(OUT)/ingest.txt
	$(GO) run $(BENCHSTAT) $(OUT)/ingest.txt | tee $(OUT)/ingest-medians.txt

# What the front door adds to a request over loopback: against two mock engines, one request
# at a time (bench/mocker at the highest speedup, max_tokens 4; chat, chat with
# nvext.token_data, completion of ids; 64 and 1,024 prompt tokens), and against the fake engine
# of frontdoor's tests (one client per CPU); BENCHCOUNT runs each, medians in
# bench/out/frontdoor-medians.txt. About 3 minutes.
FDBENCHTIME ?= 3000x
frontdoor-overhead:
	mkdir -p $(OUT)
	$(GO) test -run '^$$' -bench FrontDoorMocker -benchtime $(FDBENCHTIME) -count $(BENCHCOUNT) ./bench/mocker/ | tee $(OUT)/frontdoor.txt
	$(GO) test -run '^$$' -bench '^BenchmarkFrontDoor$$' -benchtime $(FDBENCHTIME) -count $(BENCHCOUNT) ./frontdoor/ | tee -a $(OUT)/frontdoor.txt
	$(GO) run $(BENCHSTAT) $(OUT)/frontdoor.txt | tee $(OUT)/frontdoor-medians.txt

# The hot paths (match, apply, route, and the server's route from every core at once) of BASE
# against the working tree, the two builds run alternately ROUNDS times, compared with benchstat:
# bench/out/ab/ab.txt. About 10 minutes.
BASE   ?= main
ROUNDS ?= 6
micro-ab:
	BENCHSTAT=$(BENCHSTAT) sh bench/micro-ab.sh $(BASE) $(ROUNDS)

# HTTP route throughput and latency against a no-op fasthttp handler, 8 and 1,000 workers
# (about three minutes; client and server share the machine).
load:
	mkdir -p $(OUT)
	$(GO) run ./bench/kvrload --suite | tee $(OUT)/load.txt

# The latency kvrouterd adds to a route over the no-op handler, client and server in one process on
# one CPU (GOMAXPROCS=1, pinned to the last CPU with taskset: no wake-ups across CPUs, which on a VM
# whose idle vCPUs halt dominate the tails below saturation, docs/decisions.md): 8 and 1,000
# workers, at 10 % and 50 % of the no-op's saturation on that CPU, the index holding 10^6
# residencies and taking 1 M blocks/s of KV events meanwhile; LOADRUNS pairs of runs per case,
# medians and ranges in bench/out/load-1cpu.txt. About five minutes.
LOADRUNS ?= 5
load-1cpu:
	mkdir -p $(OUT)
	$(GO) build -o $(OUT)/kvrload ./bench/kvrload
	GOMAXPROCS=1 taskset -c $$(($$(nproc) - 1)) $(OUT)/kvrload --added --added-runs $(LOADRUNS) | tee $(OUT)/load-1cpu.txt

# kvrouterd (the binary, its own process) under a paced mixed load for SOAK: routes, lifecycles,
# KV events over NATS and /v1/events, workers leaving and coming back. Fails if its RSS, heap
# in use, goroutines or file descriptors grow after warm-up (docs/performance.md, "Soak"); the
# samples go to standard output. ARGS='--profiles DIR' also saves heap profiles to compare.
SOAK ?= 3m
soak:
	mkdir -p $(OUT)
	$(GO) build -o $(OUT)/kvrouterd-soak ./cmd/kvrouterd
	$(GO) run ./bench/soak --bin $(OUT)/kvrouterd-soak --duration $(SOAK) $(ARGS)

# Each fuzz target of the module for FUZZTIME, found with go test -list (go test fuzzes one
# target per run); FUZZ narrows them by a regular expression, e.g. make fuzz FUZZ=ZMTP.
FUZZ ?= .
fuzz:
	@for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' | grep -E '$(FUZZ)'); do \
			echo "== $$pkg $$f"; \
			$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; \
	done

clean:
	rm -rf $(OUT) bin

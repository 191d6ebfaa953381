# mlx-spec: every target creates or refreshes .venv first (scripts/setup.sh).
PY := .venv/bin/python
PROMPT ?= def binary_search(items, target):\n    """Return the index of target in the sorted list items."""\n
ARGS ?=

.PHONY: demo test setup setup-dev ui bench bench-quick doctor clean

setup:
	@scripts/setup.sh

setup-dev:
	@scripts/setup.sh --dev

## The main job: speculative generation on the embedded default pair, with stats.
demo: setup
	$(PY) -m mlx_spec.generate --prompt '$(PROMPT)' --max-tokens 200 --ignore-chat-template $(ARGS)

## The test suite (about 5 minutes on a 2-core CPU).
test: setup-dev
	$(PY) -m pytest $(ARGS)

ui: setup
	$(PY) -m ui.app $(ARGS)

bench: setup-dev
	$(PY) -m benchmarks.run $(ARGS)

bench-quick: setup-dev
	$(PY) -m benchmarks.run --quick $(ARGS)

doctor: setup
	$(PY) -m mlx_spec doctor

clean:
	rm -rf .venv build *.egg-info .pytest_cache

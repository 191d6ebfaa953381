# mlx-spec: every target creates or refreshes .venv first (scripts/setup.sh).
PY := .venv/bin/python
# The checkout is the user data folder: models/ holds the default pair.
export MLX_SPEC_HOME := $(CURDIR)
PROMPT ?= Write a Python function that checks whether a string is a palindrome, then explain it in two sentences.
ARGS ?=

.PHONY: demo test setup setup-dev ui bench bench-quick doctor clean

setup:
	@scripts/setup.sh

setup-dev:
	@scripts/setup.sh --dev

## The main job: speculative generation on the default pair (SmolLM2-135M-Instruct
## and its distilled draft), through the chat template, with stats.
demo: setup
	$(PY) -m mlx_spec.generate --prompt '$(PROMPT)' --max-tokens 200 $(ARGS)

## The test suite, a file per worker on up to 4 cores (about 9 minutes on a
## 2-core CPU), ending with its slowest tests. ARGS="-n 0" runs it in one process.
test: setup-dev
	$(PY) -m pytest -n auto --maxprocesses 4 --dist loadfile --durations=40 $(ARGS)

ui: setup
	$(PY) -m ui.app $(ARGS)

bench: setup-dev
	$(PY) -m mlx_spec.bench.run $(ARGS)

bench-quick: setup-dev
	$(PY) -m mlx_spec.bench.run --quick $(ARGS)

doctor: setup
	$(PY) -m mlx_spec doctor

clean:
	rm -rf .venv build *.egg-info .pytest_cache

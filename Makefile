# The two commands a new user types (see README):
#   make run    install everything (first time ~6-12 min: llama.cpp is compiled) and start the workbench
#   make test   install everything, type-check (mypy) and run the whole test suite
PY := .venv/bin/python

.PHONY: setup run adapter test bench
setup:
	bash scripts/setup.sh

run: setup
	$(PY) -m app run

adapter: setup
	$(PY) -m adapter serve

test: setup
	bash scripts/setup.sh --browser
	$(PY) -m mypy
	$(PY) -m pytest -n auto --dist worksteal

bench: setup
	$(PY) -m bench.engine

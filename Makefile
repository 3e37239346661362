# The two commands a new user types (see README):
#   make run    install everything (first time ~6-12 min: llama.cpp is compiled) and start the workbench
#   make test   install everything, type-check (mypy) and run the whole test suite
# and, for the container (docs/deploy.md):
#   make image       build the SemIf image with buildah (installs buildah/podman from Debian; no Docker daemon)
#   make image-test  build it, then run it as SageMaker does and check the contract (tests/image)
PY := .venv/bin/python

.PHONY: setup run adapter test bench image image-test
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

image: setup
	bash scripts/image.sh

image-test: image
	SEMIF_IMAGE_TEST=1 $(PY) -m pytest -p no:cacheprovider -p no:xdist -v -s tests/image  # -s: the measured times

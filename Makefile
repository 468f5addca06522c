# Two entry points for a fresh machine (see README):
#   make demo   -- set up, then run a guarded job end to end
#   make test   -- set up, then run the whole test suite (what CI runs)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

# make image IMAGE=name:tag (default guardedcron:<version>)
IMAGE  ?=

.PHONY: setup demo test lint image release e2e-kind clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml operator/devenv/pyproject.toml .ci/bootstrap
	bash .ci/bootstrap
	@touch $@

demo: setup
	$(BIN)/guardedcron demo

# The suite in lanes side by side (operator/devenv/guardedcron_devenv/suite.py);
# with PYTEST_ARGS, one pytest session with those arguments.
test: setup lint
	$(BIN)/python -m guardedcron_devenv.suite $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check operator tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# The image from the Dockerfile, built by a local Docker engine on a stand-in base
# (no registry here; see operator/devenv/guardedcron_devenv/image.py).
image: setup
	$(BIN)/python -m guardedcron_devenv.image $(if $(IMAGE),--tag $(IMAGE))

# Every artifact of a release into dist/ from a clean, consistently versioned tree
# (docs/releasing.md); make release WITH_IMAGE=1 adds the image tarball and its SBOM.
release: setup
	$(BIN)/python -m guardedcron_devenv.release $(if $(WITH_IMAGE),--image)

# For machines with Docker and kind (not these): the same e2e suite against a kind cluster.
e2e-kind: setup
	bash tests/e2e/kind.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

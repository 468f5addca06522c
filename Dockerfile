# One image for the guardedcron operator and the guard containers it injects.
#
#   docker build -t ghcr.io/guardedcron/guardedcron:0.1.0 .
#   docker run --rm ghcr.io/guardedcron/guardedcron:0.1.0 --help
#
# The operator:  guardedcron operator --liveness=http://0.0.0.0:8080/healthz
# A guard:       guardedcron acquire --lock ... (injected by the operator)
#
# It runs as the numeric user 65532 with a read-only root filesystem: bytecode is
# compiled at build time and never written at run time, and nothing writes outside
# mounted volumes. `make image` builds it with a local engine (no registry needed:
# PYTHON_IMAGE names a stand-in base); tests/image run the result as pods do, and
# tests/packaging/test_dockerfile.py lints this file with hadolint.

# Pin a digest for reproducible builds: --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ARG VENV=/opt/guardedcron
ARG WHEELS=/wheels
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY operator/ ./operator/
# operator/guardedcron/crds links here: the wheel ships the CRD that `render` reads.
COPY crds/ ./crds/
# The venv's own pip builds the wheel and installs it; every dependency is a
# prebuilt wheel (psycopg[binary] included), so no compiler is needed. Then the
# installer goes: pip and setuptools have no place in the final image. So does the
# official kubernetes client (about 140 MB with its bytecode): only the CLI's kubeconfig
# logins use it, on users' machines; the operator and the guard never import it.
RUN python -m venv "$VENV" \
    && "$VENV/bin/pip" wheel --no-deps --wheel-dir "$WHEELS" . \
    && "$VENV/bin/pip" install --only-binary=:all: "$WHEELS"/guardedcron-*.whl \
    && "$VENV/bin/pip" uninstall --yes pip setuptools kubernetes

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="guardedcron" \
      org.opencontainers.image.description="Kubernetes operator and guard: scheduled jobs that run once" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/guardedcron/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GUARDEDCRON_CRD=/usr/share/guardedcron/crds/guardedcronjobs.guardedcron.io.yaml
COPY --from=builder /opt/guardedcron /opt/guardedcron
# `guardedcron render` reads the CRD's schema defaults.
COPY crds/ /usr/share/guardedcron/crds/
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["guardedcron"]
CMD ["--help"]

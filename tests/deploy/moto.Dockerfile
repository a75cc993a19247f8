# An S3 server for the compose test (tests/deploy/compose.podman.yaml) in MinIO's place, whose
# images cannot be pulled here: moto's server, on the local base (scripts/base-image.sh). Its objects
# live in memory: they do not outlive the container.
ARG PYTHON_IMAGE=localhost/busscrape-base:bookworm
FROM ${PYTHON_IMAGE}
# hadolint ignore=DL3013
RUN pip install --no-cache-dir "moto[server]"
ENTRYPOINT ["moto_server"]
CMD ["-H", "0.0.0.0", "-p", "9000"]

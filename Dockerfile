# syntax=docker/dockerfile:1
# The marin3r image: one `marin3r` binary (operator, discovery-service with its webhook, and
# the CLI) on a distroless runtime, run as the unprivileged `nonroot` user (65532).
# `hack/image --docker` builds it with docker or podman; `hack/image` alone writes the same
# image as an archive without either (the same files at the same paths, user, entrypoint and
# Envoy release, with glibc and libgcc from Debian's packages; discovery/tests/it/
# image_archive.rs checks they agree). docs/install.md says how to load it into a cluster.
#
# Build stage: the official Rust image (Debian bookworm, glibc 2.36). Runtime:
# gcr.io/distroless/cc-debian12 (the same glibc plus libgcc, nothing else: no shell, no
# package manager). Both are public; override them with --build-arg for a mirror.
ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
# The Envoy the discovery pod's validating webhook runs (`envoy --mode validate`) as the last
# judge of an EnvoyConfig: the release the sidecars run by default.
ARG ENVOY_IMAGE=docker.io/envoyproxy/envoy:v1.40.0

FROM ${ENVOY_IMAGE} AS envoy

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p marin3r-discovery --bin marin3r \
    && cp target/release/marin3r /marin3r

FROM ${RUNTIME_IMAGE}
COPY --from=build /marin3r /usr/local/bin/marin3r
COPY --from=envoy /usr/local/bin/envoy /usr/local/bin/envoy
# Numeric, so kubelet can check `runAsNonRoot` without reading /etc/passwd.
# Keep in step with marin3r_discovery::IMAGE_USER (discovery/tests/it/image.rs checks).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/marin3r"]

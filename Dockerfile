# syntax=docker/dockerfile:1
# The sluice image: one static-ish binary (glibc, OpenSSL) on distroless, non-root, read-only
# root filesystem friendly. The build step is scripts/build-release, the same command
# scripts/test runs, so CI proves it.
ARG RUST_VERSION=1.95.0

FROM rust:${RUST_VERSION}-bookworm AS build
# librdkafka is built from source by the rdkafka crate (cmake not needed: its default build uses
# ./configure); OpenSSL is linked from the system, libcurl (OAuth/OIDC) built in statically.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libssl-dev libcurl4-openssl-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
ENV CARGO_TARGET_DIR=/src/target
COPY Cargo.toml Cargo.lock rust-toolchain.toml build.rs ./
# librdkafka's build flags (a section per function, for the layout link/ gives the linker).
COPY .cargo .cargo
# The workspace's other member (tests and benchmark, not in the image): its manifest is enough.
COPY harness/Cargo.toml harness/Cargo.toml
COPY scripts/build-release scripts/build-release
# Dependencies first, against stub sources: this layer stays cached until Cargo.lock changes.
RUN mkdir -p src harness/src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs harness/src/lib.rs \
    && scripts/build-release \
    && rm -rf src
COPY src src
COPY migrations migrations
# The functions an agent runs, laid out together by the linker (build.rs): less idle memory.
COPY link link
ARG SLUICE_GIT_SHA=unknown
ENV SLUICE_GIT_SHA=${SLUICE_GIT_SHA}
RUN touch src/main.rs src/lib.rs \
    && scripts/build-release \
    && cp target/release/sluice /sluice

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /sluice /usr/local/bin/sluice
USER 65532:65532
# Agent and persister admin ports (/metrics, /healthz, /readyz, /config).
EXPOSE 9464 9465
STOPSIGNAL SIGTERM
ENTRYPOINT ["sluice"]
CMD ["agent", "--config", "/etc/sluice/agent.toml"]

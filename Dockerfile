# syntax=docker/dockerfile:1
#
# The outbox-relay image ships the relay only (the default, last stage; tests/packaging.rs
# checks this file against the binary's --help):
#   docker build -t outbox-relay .
#   docker run --rm -e DATABASE_URL=... -e AMQP_URL=... outbox-relay run
#
# The consumer (crates/outbox-inbox) has its own image, the `inbox` stage:
#   docker build --target inbox -t outbox-inbox .
#
# The benchmark tool (crates/outbox-bench) has its own image, the `bench` stage; the compose
# file's `demo` service uses it for the end-to-end check:
#   docker build --target bench -t outbox-bench .
#   docker run --rm -e DATABASE_URL=... -e AMQP_URL=... outbox-bench demo
#
# The builder is pinned to bookworm, like the runtime: a binary built on a newer Debian
# (rust:1 follows the latest release) needs a newer glibc than bookworm-slim has.

FROM rust:1-bookworm AS builder
WORKDIR /src
# The whole tree (less .dockerignore): cargo loads every workspace member's manifest, and
# whatever a manifest names (tests, benches, a README included as docs) must exist.
COPY . .

# Each build stage names one package, so the relay's image never compiles the benchmark.
# The cache mounts keep the registry and compiled dependencies between builds; the binary is
# copied out of the cached target dir (stripped) in the same step.
FROM builder AS relay-build
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p outbox-relay --bin outbox-relay \
    && install -s -m 0755 target/release/outbox-relay /usr/local/bin/

FROM builder AS bench-build
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p outbox-bench --bin outbox-bench \
    && install -s -m 0755 target/release/outbox-bench /usr/local/bin/

FROM builder AS inbox-build
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p outbox-inbox --bin outbox-inbox \
    && install -s -m 0755 target/release/outbox-inbox /usr/local/bin/

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin outbox
USER 10001:10001

# The benchmark tool: `docker build --target bench`.
FROM runtime AS bench
COPY --from=bench-build /usr/local/bin/outbox-bench /usr/local/bin/
ENTRYPOINT ["outbox-bench"]
CMD ["demo"]

# The consumer's side (docs/consumers.md): `docker build --target inbox -t outbox-inbox .`,
# then `docker run … outbox-inbox setup` once and `consume` (the default) per replica.
FROM runtime AS inbox
COPY --from=inbox-build /usr/local/bin/outbox-inbox /usr/local/bin/
ENTRYPOINT ["outbox-inbox"]
CMD ["consume"]

# The relay: the default target, so it stays last. Its one binary, stripped; bash (for a
# healthcheck on /healthz over /dev/tcp, as docker-compose.yml does) comes with the base.
FROM runtime AS relay
COPY --from=relay-build /usr/local/bin/outbox-relay /usr/local/bin/
# /metrics, /healthz and /readyz, once OUTBOX_METRICS_ADDR=0.0.0.0:9187 makes the relay
# listen beyond the container's loopback.
EXPOSE 9187
ENTRYPOINT ["outbox-relay"]
CMD ["run"]

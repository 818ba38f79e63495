# syntax=docker/dockerfile:1
#
# outbox-relay image: `outbox-relay` (the entrypoint) and `outbox-bench`.
#   docker build -t outbox-relay .
#   docker run --rm -e DATABASE_URL=... -e AMQP_URL=... outbox-relay run
#
# The builder is pinned to bookworm, like the runtime: a binary built on a newer Debian
# (rust:1 follows the latest release) needs a newer glibc than bookworm-slim has.

FROM rust:1-bookworm AS builder
WORKDIR /src
# The whole tree (less .dockerignore): whatever the manifest names (tests, benches, a README
# included as docs) must exist for cargo to load it.
COPY . .
# The cache mounts keep the registry and compiled dependencies between builds; the
# binaries are copied out of the cached target dir in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
    && install -m 0755 target/release/outbox-relay target/release/outbox-bench /usr/local/bin/

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin outbox
COPY --from=builder /usr/local/bin/outbox-relay /usr/local/bin/outbox-bench /usr/local/bin/
USER 10001:10001
ENTRYPOINT ["outbox-relay"]
CMD ["run"]

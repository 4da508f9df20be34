# flow in a container: a multi-stage build, the binary on a slim base, run as a non-root user.
#
#   docker build --build-arg FLOW_GIT_COMMIT=$(git rev-parse --short=12 HEAD) -t flow .
#   docker run --rm -e FLOW_DATABASE_URL=postgres://flow@db/flow flow daemon --metrics-addr 0.0.0.0:9464
#
# `.git` is not sent to the build (.dockerignore); FLOW_GIT_COMMIT carries the commit that
# `flow version` and the flow_build_info metric report.

FROM rust:1.95-bookworm AS build
WORKDIR /src
ARG FLOW_GIT_COMMIT=unknown
ENV FLOW_GIT_COMMIT=${FLOW_GIT_COMMIT}
COPY . .
RUN cargo build --release --locked --bin flow && strip target/release/flow

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --create-home --home-dir /var/lib/flow flow
COPY --from=build /src/target/release/flow /usr/local/bin/flow
USER 10001
WORKDIR /var/lib/flow
EXPOSE 9464
ENTRYPOINT ["flow"]
CMD ["daemon"]

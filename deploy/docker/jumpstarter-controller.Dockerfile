# syntax=docker/dockerfile:1
# jumpstarter-controller: docker build -f deploy/docker/jumpstarter-controller.Dockerfile -t jumpstarter-controller:dev .
# (build context: the repository root)
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p jumpstarter-controller --bin jumpstarter-controller \
    && install -D target/release/jumpstarter-controller /out/jumpstarter-controller \
    && strip --strip-debug /out/jumpstarter-controller

# Minimal runtime: glibc + libgcc only, no shell, runs as uid 65532. `cargo xtask images`
# assembles the same image without a container engine from this final stage: keep to
# COPY --from, ENV, EXPOSE, USER, WORKDIR, ENTRYPOINT and CMD (it refuses anything else).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/jumpstarter-controller /usr/local/bin/jumpstarter-controller
# gRPC (8082) and the in-process router (8083), both TLS on every interface by default.
# Metrics are not exposed: the binary serves them on 127.0.0.1:8084 by default, inside the
# container only; --metrics-listen=0.0.0.0:PORT serves them outside (the Kubernetes
# Deployment of deploy/kubernetes uses 0.0.0.0:8080).
EXPOSE 8082 8083
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/jumpstarter-controller"]

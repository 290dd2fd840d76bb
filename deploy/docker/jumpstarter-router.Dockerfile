# syntax=docker/dockerfile:1
# jumpstarter-router: docker build -f deploy/docker/jumpstarter-router.Dockerfile -t jumpstarter-router:dev .
# (build context: the repository root)
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p jumpstarter-router --bin jumpstarter-router \
    && install -D target/release/jumpstarter-router /out/jumpstarter-router \
    && strip --strip-debug /out/jumpstarter-router

# Minimal runtime: glibc + libgcc only, no shell, runs as uid 65532. `cargo xtask images`
# assembles the same image without a container engine from this final stage: keep to
# COPY --from, ENV, EXPOSE, USER, WORKDIR, ENTRYPOINT and CMD (it refuses anything else).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/jumpstarter-router /usr/local/bin/jumpstarter-router
EXPOSE 8083
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/jumpstarter-router"]

# syntax=docker/dockerfile:1
# jmp (and j) for CI jobs: docker build -f deploy/docker/jmp.Dockerfile -t jmp:dev .
# (build context: the repository root). Debian slim rather than distroless: CI steps
# (Tekton `script:`, GitLab `script:`) need a shell.
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p jumpstarter-cli --bin jmp --bin j \
    && install -D target/release/jmp /out/jmp \
    && install -D target/release/j /out/j

FROM docker.io/library/debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 65532 --create-home jumpstarter
COPY --from=build /out/jmp /out/j /usr/local/bin/
USER 65532:65532
WORKDIR /home/jumpstarter
ENTRYPOINT ["/usr/local/bin/jmp"]

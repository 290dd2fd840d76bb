# syntax=docker/dockerfile:1
# jmp (and j) for CI jobs: docker build -f deploy/docker/jmp.Dockerfile -t jmp:dev .
# (build context: the repository root). Distroless plus busybox: CI steps (Tekton `script:`
# with `#!/bin/sh`, GitLab `script:`) need a shell and the usual small tools.
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p jumpstarter-cli --bin jmp --bin j \
    && install -D target/release/jmp /out/jmp \
    && install -D target/release/j /out/j \
    && strip --strip-debug /out/jmp /out/j

# Debian's statically linked busybox, with its applets (sh, ls, cat, env, ...) as symlinks.
FROM docker.io/library/debian:bookworm-slim AS busybox
RUN apt-get update \
    && apt-get install -y --no-install-recommends busybox-static \
    && mkdir -p /out/bin \
    && cp /bin/busybox /out/bin/busybox \
    && for a in $(/out/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "/out/bin/$a"; done

# The same runtime as the controller's (glibc + libgcc, CA certificates, uid 65532 `nonroot`
# with home /home/nonroot), plus /bin/sh. `cargo xtask images` assembles this final stage
# without a container engine: keep to COPY --from, ENV, EXPOSE, USER, WORKDIR, ENTRYPOINT, CMD.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=busybox /out/bin/ /bin/
COPY --from=build /out/jmp /out/j /usr/local/bin/
USER 65532:65532
WORKDIR /home/nonroot
ENTRYPOINT ["/usr/local/bin/jmp"]

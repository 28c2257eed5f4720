# The `floe` image: one static binary for the operator, the gateway sidecar, the sandbox runner
# (copied by the sandbox pods' init container into the harness image, whatever its libc — hence
# musl and static) and the dataset collector. Build from the repository root:
#   docker build -t ghcr.io/floe-dev/floe:0.1.0 .
# Not built in CI (no container runtime there, and the musl target is not installable offline);
# what CI builds and tests is the same crate for the host target.
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p floe --target x86_64-unknown-linux-musl \
    && install -D -m 0755 target/x86_64-unknown-linux-musl/release/floe /out/floe

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/floe /usr/local/bin/floe
USER 65532:65532
ENTRYPOINT ["floe"]

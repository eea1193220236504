# The standard controller container: a static-ish release build on Debian, run as non-root.
# Not built in CI here (no Docker engine on the build machines); `cargo build --release -p nodeipam`
# is what CI checks.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p nodeipam --bin nodeipam-controller

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/nodeipam-controller /usr/local/bin/nodeipam-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/nodeipam-controller"]

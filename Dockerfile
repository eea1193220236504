# The standard controller container (deploy/ runs it in kube-system).
#
# No Docker engine is reachable on the build machines, so .ci/run proves what it can without one:
# it runs the `RUN cargo build …` line below verbatim (so the two cannot drift), checks that the
# binary is at most 15 MB, that it needs nothing newer than the final image's glibc, and that it
# starts — `--version`, then the secure port answering over TLS — as user 65532 inside an empty
# root filesystem holding only what the final image holds for it (the binary, glibc's loader and
# libraries, libgcc_s, the CA bundle — the kube client's TLS stack refuses to start without one,
# which is one reason this is not `scratch`).
#
# Why distroless/cc and not scratch: the binary links glibc (ring's C/assembly parts and std use
# it); a static musl build would need a musl C toolchain in CI and changes the allocator. The cc
# image is glibc + libgcc_s + CA certificates and nothing else: no shell, no package manager.
# Stripping: the release profile (Cargo.toml) builds without debug info and strips symbols.
# Pin the images by digest (`@sha256:…`) in your build pipeline; this file names tags only
# because no registry is reachable from here to resolve them.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p nodeipam --bin nodeipam-controller

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/nodeipam-controller /usr/local/bin/nodeipam-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/nodeipam-controller"]

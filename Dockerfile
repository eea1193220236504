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
# Both architectures, one command (needs buildx; no Docker engine here, see BENCHMARKS.md for the
# two binaries' sizes):
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/nodeipam-controller:TAG --push .
#
# The build stage always runs on the build machine's own architecture ($BUILDPLATFORM) and
# cross-compiles for the image's ($TARGETARCH, set by buildx): a native build under emulation
# would take many times longer. Cross-linking uses Debian's cross gcc, the same toolchain
# .ci/run uses for its arm64 build, which it then runs under qemu-user (`--version`, `plan` on
# the fixtures byte-identical to amd64's, and an end-to-end run against the sandbox API server).
# The rust image's Cargo home gets `build.target` for the image's architecture, so the
# `RUN cargo build …` line stays the one .ci/run runs verbatim; the binary then lands in
# target/<triple>/release/. The final image is distroless/cc for that architecture (a multi-arch
# image: buildx picks the matching variant, glibc 2.36 on both).
FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS build
ARG BUILDARCH
ARG TARGETARCH
RUN set -eu; \
    case "$TARGETARCH" in \
        amd64) triple=x86_64-unknown-linux-gnu; gnu=x86_64-linux-gnu; cross=gcc-x86-64-linux-gnu; libc=libc6-dev-amd64-cross ;; \
        arm64) triple=aarch64-unknown-linux-gnu; gnu=aarch64-linux-gnu; cross=gcc-aarch64-linux-gnu; libc=libc6-dev-arm64-cross ;; \
        *) echo "TARGETARCH=$TARGETARCH: this Dockerfile builds amd64 and arm64" >&2; exit 1 ;; \
    esac; \
    if [ "$TARGETARCH" != "$BUILDARCH" ]; then \
        apt-get update; \
        apt-get install -y --no-install-recommends "$cross" "$libc"; \
        rm -rf /var/lib/apt/lists/*; \
        rustup target add "$triple"; \
    fi; \
    printf '[build]\ntarget = "%s"\n[target.%s]\nlinker = "%s-gcc"\n' "$triple" "$triple" "$gnu" \
        >>"$CARGO_HOME/config.toml"; \
    echo "$triple" >/rust-target
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p nodeipam --bin nodeipam-controller
RUN cp "target/$(cat /rust-target)/release/nodeipam-controller" /nodeipam-controller

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /nodeipam-controller /usr/local/bin/nodeipam-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/nodeipam-controller"]

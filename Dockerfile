# The pagewarden image: one static binary on a distroless base, run as a
# non-root user. Build it from the repository root:
#
#   docker build -t pagewarden:dev .
#
# The build stage runs the README's build command ("Container image"), which
# TestDockerfile in internal/cli checks against this file. CGO_ENABLED=0:
# nothing in pagewarden uses cgo (the kernels are Go assembly), so the binary
# needs no libc and the runtime image needs nothing but the binary.
# The Go version is go.mod's go line.
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY cmd ./cmd
COPY internal ./internal
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/pagewarden ./cmd/pagewarden

# distroless/static: CA certificates, /etc/passwd with a nonroot user, no
# shell and no package manager. UID 65532 is its "nonroot" user; it is
# given as a number so that Kubernetes' runAsNonRoot can verify it.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/pagewarden /usr/local/bin/pagewarden
USER 65532:65532
# API (serve, gateway), node link (prefill, decode), metrics.
EXPOSE 8080 7001 9464
ENTRYPOINT ["/usr/local/bin/pagewarden"]
# The built-in model needs no download: `docker run -p 8080:8080
# pagewarden:dev` serves builtin:tiny and prints an API key. The manifests in
# deploy/kubernetes give a role and its flags as args instead.
CMD ["serve", "--listen=0.0.0.0:8080"]

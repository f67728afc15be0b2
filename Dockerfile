# settle's one image: api, worker, scheduler and settlectl, static, run as
# a non-root user on distroless. The command picks the service:
#
#   docker build -t settle:dev --build-arg VERSION=1.2.3 --build-arg REVISION=$(git rev-parse HEAD) .
#   docker run settle:dev                              # api (the default)
#   docker run settle:dev /usr/local/bin/api migrate
#   docker run settle:dev /usr/local/bin/worker
#   docker run settle:dev /usr/local/bin/scheduler
#   docker run settle:dev /usr/local/bin/settlectl ...
#
# The cache mounts need BuildKit (the default builder since Docker 23).

# Keep GO_VERSION at or above go.mod's go line: GOTOOLCHAIN=local below makes
# an older image fail loudly instead of downloading a toolchain.
ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION} AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

# Modules first: this layer is rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download

# What settle_build_info and `settlectl version` report:
#   docker build --build-arg VERSION=1.2.3 --build-arg REVISION=$(git rev-parse HEAD) .
# .git stays out of the build context, so without REVISION the binaries
# say "unknown".
ARG VERSION
ARG REVISION

COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -o /out/ \
        -ldflags="-s -w -X github.com/settle/settle/pkg/buildinfo.version=${VERSION} -X github.com/settle/settle/pkg/buildinfo.revision=${REVISION}" \
        ./cmd/api ./cmd/worker ./cmd/scheduler ./cmd/settlectl ./deploy/healthcheck

# static-debian12 carries CA certificates (the RPC and webhook endpoints are
# HTTPS) and nothing else: no shell, no package manager. Container
# healthchecks use the healthcheck binary built above.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
# Numeric, so Kubernetes' runAsNonRoot can verify it (65532 is distroless'
# nonroot user).
USER 65532:65532
# api; worker and scheduler serve /metrics, /healthz and /readyz here.
EXPOSE 8080 9091 9092
CMD ["/usr/local/bin/api"]

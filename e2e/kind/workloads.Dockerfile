# aether-e2e-workloads image: the scenario suite's test workloads (e2e/workloads: echo, client,
# serverfirst) in /usr/local/bin, where the kind cluster pair (e2e/scenarios/kind.go) runs them.
# Build from the repository root (e2e/kind/up.sh does):
#   docker build -f e2e/kind/workloads.Dockerfile -t aether-e2e-workloads:dev .
# GO_VERSION follows go.mod's go line, like images/. The same image is built without Docker by
# package images (images.WorkloadsImage; images_test.go keeps the two in step).
ARG GO_VERSION=1.26.8
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-trixie AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -ldflags="-s -w" -o /out/ \
    ./e2e/workloads/echo ./e2e/workloads/client ./e2e/workloads/serverfirst

FROM debian:bookworm-slim
COPY --from=build /out/echo /out/client /out/serverfirst /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/client", "sleep"]

#!/usr/bin/env bash
# Regenerates link.pb.go and link_grpc.pb.go from link.proto. The
# generated files are committed: building and testing need none of this.
#
# Tools (the versions that made the committed files):
#   apt-get update && apt-get install -y protobuf-compiler   # protoc
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
set -euo pipefail
cd "$(dirname "$0")"
PATH="$(go env GOPATH)/bin:$PATH"
protoc --proto_path=. \
  --go_out=. --go_opt=paths=source_relative \
  --go-grpc_out=. --go-grpc_opt=paths=source_relative \
  link.proto

// Package linkpb is the generated protobuf and gRPC code of link.proto,
// schema pagewarden.link.v1: one message, Frame, that carries a whole
// transfer frame, and the Link service's bidirectional Exchange stream.
// Edit link.proto and run generate.sh; never edit the *.pb.go files.
package linkpb

//go:generate ./generate.sh

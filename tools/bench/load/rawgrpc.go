package load

import (
	"fmt"

	"google.golang.org/grpc/mem"
)

// rawMsg is a request or answer already in protobuf bytes: the load
// generator marshals each OTLP request once and resends the same bytes.
type rawMsg []byte

// rawCodec passes rawMsg through gRPC unchanged. It is named "proto" so the
// content type is what an OTLP exporter sends (application/grpc+proto).
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*rawMsg)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(*m)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*rawMsg)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	*m = data.Materialize()
	return nil
}

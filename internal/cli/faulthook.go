package cli

import (
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// wrapLink, when set, stands between a prefill or decode node's transport
// and its driver: the canary soak (internal/cli's tests, whose binary acts
// as pagewarden in the processes it starts) sets it in those processes to
// drop, duplicate and delay handoff frames above TLS, where a TCP proxy
// cannot reach them. Nothing else sets it: a pagewarden binary runs with
// nil, and its transports go to the driver as they are.
var wrapLink func(role transfer.Role, name string, t link.Transport) link.Transport

// nodeTransport is what r's driver talks through.
func (r *roleNode) nodeTransport() link.Transport {
	t := link.Transport(r.t)
	if wrapLink != nil {
		t = wrapLink(r.role, r.lf.name, t)
	}
	return r.ms.fenced(t)
}

package cli

import (
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// serveWrap, when set, stands between each node of serve's in-process
// cluster and its transport. Only a binary built with -tags pw_mutants can
// set it (mutant_select.go, from PAGEWARDEN_MUTANT_FAULT): a mutant's
// positive control pairs the bug with the handoff fault that makes it
// show from outside. A release binary runs with nil.
var serveWrap func(name transfer.Peer, t link.Transport) link.Transport

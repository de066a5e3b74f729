package gateway

import "github.com/pagewarden/pagewarden/internal/gateway/tenants"

// Tenants returns the tenants in force (tenants.Registry.Tenants): what a
// reload is compared with (tenants.Diff) for its audit line.
func (s *Server) Tenants() []tenants.Tenant { return s.reg.Tenants() }

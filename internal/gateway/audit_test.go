package gateway_test

import (
	"math"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
)

// TestAuditRateRefused: the audit rate is a fraction; anything else stops
// the server from being built, naming it.
func TestAuditRateRefused(t *testing.T) {
	for _, rate := range []float64{-0.1, 1.5, math.NaN(), math.Inf(1)} {
		_, err := gateway.New(gateway.Config{Backend: gatewaytest.NewFake(), Tenants: testTenants(tenants.Limits{}, tenants.Limits{}), AuditRate: rate})
		if err == nil || !strings.Contains(err.Error(), "audit rate") {
			t.Errorf("AuditRate %g: err %v, want a refusal naming the audit rate", rate, err)
		}
	}
	if _, err := gateway.New(gateway.Config{Backend: gatewaytest.NewFake(), Tenants: testTenants(tenants.Limits{}, tenants.Limits{}), AuditQueue: -1}); err == nil || !strings.Contains(err.Error(), "audit queue") {
		t.Errorf("AuditQueue -1: err %v, want a refusal naming the audit queue", err)
	}
	for _, rate := range []float64{0, 0.01, 1} {
		if _, err := gateway.New(gateway.Config{Backend: gatewaytest.NewFake(), Tenants: testTenants(tenants.Limits{}, tenants.Limits{}), AuditRate: rate}); err != nil {
			t.Errorf("AuditRate %g: %v", rate, err)
		}
	}
}

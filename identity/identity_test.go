package identity

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

func newCA(t *testing.T, lifetime time.Duration) (*DevCA, *testenv.CA) {
	t.Helper()
	ca, err := testenv.NewCA("identity test CA")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cf, kf := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca.key")
	if err := os.WriteFile(cf, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kf, ca.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	dev, err := LoadDevCA(cf, kf, "aether.internal", lifetime)
	if err != nil {
		t.Fatal(err)
	}
	return dev, ca
}

// TestDevCAIssue: the SVID's only URI SAN is the SPIFFE ID, it verifies against the bundle for
// client and server use, and lives for the configured lifetime.
func TestDevCAIssue(t *testing.T) {
	dev, _ := newCA(t, 10*time.Minute)
	id := "spiffe://aether.internal/ns/shop/sa/web"
	s, err := dev.Issue(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(s.CertChainPEM)
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(cert.URIs) != 1 || cert.URIs[0].String() != id {
		t.Errorf("URI SANs = %v, want [%s]", cert.URIs, id)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(dev.BundlePEM())
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("verify for %v: %v", usage, err)
		}
	}
	if got := s.NotAfter.Sub(s.IssuedAt); got < 9*time.Minute || got > 11*time.Minute {
		t.Errorf("lifetime = %s, want 10m", got)
	}
	if got := s.RenewAt().Sub(s.IssuedAt); got != 5*time.Minute {
		t.Errorf("renew after %s, want half the lifetime (5m)", got)
	}
}

func TestDevCAErrors(t *testing.T) {
	dev, ca := newCA(t, time.Hour)
	for _, id := range []string{"spiffe://other.domain/ns/a/sa/b", "not a spiffe id", ""} {
		if _, err := dev.Issue(context.Background(), id); err == nil {
			t.Errorf("Issue(%q) = nil error", id)
		}
	}
	leaf, key, err := ca.Issue("leaf", nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewDevCA(leaf, key, "aether.internal", 0); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Errorf("NewDevCA(leaf) = %v, want a not-a-CA error", err)
	}
	if _, err := NewDevCA(ca.CertPEM, ca.KeyPEM, "Bad Domain!", 0); err == nil {
		t.Error("NewDevCA(bad trust domain) = nil error")
	}
	if _, err := LoadDevCA("/nonexistent/ca.pem", "/nonexistent/ca.key", "aether.internal", 0); err == nil {
		t.Error("LoadDevCA(missing files) = nil error")
	}
}

// TestRotator: SVIDs are reused before their half-life, replaced at it, and forgotten when their
// ID is no longer asked for.
func TestRotator(t *testing.T) {
	dev, _ := newCA(t, time.Hour)
	now := time.Now()
	dev.now = func() time.Time { return now }
	r := NewRotator(dev)
	r.now = func() time.Time { return now }
	ctx := context.Background()
	a, b := "spiffe://aether.internal/ns/x/sa/a", "spiffe://aether.internal/ns/x/sa/b"
	first, changed, err := r.SVIDs(ctx, []string{a, b})
	if err != nil || !changed || len(first) != 2 {
		t.Fatalf("first SVIDs: %v %v %v", first, changed, err)
	}
	if got := r.NextRenewal(); !got.Equal(now.Add(30 * time.Minute)) {
		t.Errorf("NextRenewal = %s, want issue + 30m", got)
	}
	now = now.Add(29 * time.Minute)
	again, changed, _ := r.SVIDs(ctx, []string{a, b})
	if changed || again[0] != first[0] {
		t.Errorf("before half-life: changed=%v, want the same SVIDs", changed)
	}
	now = now.Add(2 * time.Minute)
	renewed, changed, _ := r.SVIDs(ctx, []string{a})
	if !changed || renewed[0] == first[0] {
		t.Errorf("after half-life: changed=%v, want a new SVID", changed)
	}
	if got := r.NextRenewal(); !got.Equal(now.Add(30 * time.Minute)) {
		t.Errorf("NextRenewal after forgetting b = %s, want %s", got, now.Add(30*time.Minute))
	}
}

package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// SVID is one X.509 SVID: a leaf certificate whose only URI SAN is SPIFFEID, its private key and
// the trust bundle that validates it.
type SVID struct {
	// SPIFFEID is the workload identity, spiffe://<trustDomain>/ns/<ns>/sa/<sa>.
	SPIFFEID string
	// CertChainPEM is the leaf certificate (then any intermediates) in PEM.
	CertChainPEM []byte
	// KeyPEM is the leaf's private key in PEM (PKCS#8).
	KeyPEM []byte
	// NotBefore and NotAfter bound the leaf's validity (NotBefore is backdated for clock skew).
	NotBefore, NotAfter time.Time
	// IssuedAt is when the SVID was signed.
	IssuedAt time.Time
}

// RenewAt returns the time at which the SVID should be replaced: half-way between its issuing and
// its expiry.
func (s *SVID) RenewAt() time.Time {
	return s.IssuedAt.Add(s.NotAfter.Sub(s.IssuedAt) / 2)
}

// Source issues SVIDs on request: the development CA implements it, and a Rotator renews them
// at half-life. SPIRE issues and rotates SVIDs itself, so it is not a Source but a Provider
// (identity/spire.Provider).
type Source interface {
	// TrustDomain returns the trust domain the source issues for (e.g. "aether.internal").
	TrustDomain() string
	// BundlePEM returns the trust bundle (CA certificates, PEM) that validates every SVID of the
	// trust domain.
	BundlePEM() []byte
	// Issue returns a fresh SVID for id, which must belong to TrustDomain. It returns an error
	// naming the ID when it does not.
	Issue(ctx context.Context, id string) (*SVID, error)
}

// Workload is one pod the node proxy serves: its UID and the SPIFFE ID the mesh gives it
// (spiffe://<trustDomain>/ns/<ns>/sa/<sa>).
type Workload struct {
	UID      string
	SPIFFEID string
}

// Provider gives the node proxy the SVIDs of its pods and the trust bundle its TLS validates
// against: the development CA through a Rotator, or SPIRE's Delegated Identity API
// (identity/spire).
type Provider interface {
	// SVIDs returns the current SVID of each SPIFFE ID of pods, issuing or renewing what it
	// must; changed reports whether any SVID differs from the last call's. A provider that
	// cannot have an SVID for a pod yet (SPIRE before the pod's entry reaches the node) leaves
	// its ID out; an error means none could be given.
	SVIDs(ctx context.Context, pods []Workload) (svids map[string]*SVID, changed bool, err error)
	// Bundles returns the trust bundles (CA certificates, PEM) by trust domain name: the mesh's
	// own trust domain and every trust domain it federates with (SPIFFE Trust Domain and
	// Bundle, section 4). The mesh's own is missing until the provider has it.
	Bundles() map[string][]byte
	// NextRenewal returns when SVIDs should be asked for again without anything else changing
	// (the earliest half-life or expiry of those held; zero when none is held).
	NextRenewal() time.Time
	// Changed is signalled when SVIDs or the bundle changed without a call (SPIRE's rotations);
	// nil when that never happens.
	Changed() <-chan struct{}
	// Lacks reports whether, as of the last SVIDs call, the provider had no SVID of the pod
	// with uid's own, even when another pod of the same SPIFFE ID had one (SPIRE: a pod out of
	// its ClusterSPIFFEID's selector): the node proxy leaves such a pod out.
	Lacks(uid string) bool
}

// DevCA is the development certificate authority: it signs SVIDs with a CA key held in memory.
type DevCA struct {
	td       spiffeid.TrustDomain
	cert     *x509.Certificate
	key      any
	certPEM  []byte
	lifetime time.Duration
	now      func() time.Time
}

// DefaultSVIDLifetime is the lifetime of SVIDs the development CA issues when none is given.
const DefaultSVIDLifetime = time.Hour

// LoadDevCA reads a CA certificate and its private key (PEM files; the key as PKCS#8, SEC 1 EC or
// PKCS#1 RSA) and returns a DevCA issuing SVIDs of the given lifetime (DefaultSVIDLifetime when
// zero) for trustDomain. It returns an error naming the file or field that is wrong.
func LoadDevCA(certFile, keyFile, trustDomain string, lifetime time.Duration) (*DevCA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("read CA key: %w", err)
	}
	return NewDevCA(certPEM, keyPEM, trustDomain, lifetime)
}

// NewDevCA is LoadDevCA from PEM bytes.
func NewDevCA(certPEM, keyPEM []byte, trustDomain string, lifetime time.Duration) (*DevCA, error) {
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return nil, fmt.Errorf("parse trust domain %q: %w", trustDomain, err)
	}
	if lifetime <= 0 {
		lifetime = DefaultSVIDLifetime
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("parse CA certificate: no PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("parse CA certificate: %q is not a CA (basicConstraints CA=false)", cert.Subject)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("parse CA key: no PEM block")
	}
	var key any
	switch kb.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(kb.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("parse CA key (%s): %w", kb.Type, err)
	}
	return &DevCA{td: td, cert: cert, key: key, certPEM: pem.EncodeToMemory(cb), lifetime: lifetime, now: time.Now}, nil
}

// TrustDomain implements Source.
func (c *DevCA) TrustDomain() string { return c.td.Name() }

// BundlePEM implements Source: the CA certificate.
func (c *DevCA) BundlePEM() []byte { return slices.Clone(c.certPEM) }

// Issue implements Source: a new ECDSA P-256 key and a leaf certificate with the URI SAN id,
// valid from one minute ago (clock skew) for the CA's SVID lifetime, usable for TLS client and
// server authentication (X.509-SVID spec, section 4).
func (c *DevCA) Issue(_ context.Context, id string) (*SVID, error) {
	sid, err := spiffeid.FromString(id)
	if err != nil {
		return nil, fmt.Errorf("issue SVID: parse SPIFFE ID %q: %w", id, err)
	}
	if sid.TrustDomain() != c.td {
		return nil, fmt.Errorf("issue SVID: SPIFFE ID %q is not in trust domain %q", id, c.td.Name())
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("issue SVID: generate key: %w", err)
	}
	u, _ := url.Parse(sid.String())
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	now := c.now()
	notBefore := now.Add(-time.Minute)
	notAfter := now.Add(c.lifetime)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"aether"}},
		URIs:         []*url.URL{u},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyAgreement,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("issue SVID %s: sign: %w", id, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("issue SVID %s: marshal key: %w", id, err)
	}
	return &SVID{
		SPIFFEID:     sid.String(),
		CertChainPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:       pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		IssuedAt:     now,
	}, nil
}

// Rotator keeps one current SVID per SPIFFE ID and replaces each at half its lifetime. It is
// safe for concurrent use.
type Rotator struct {
	src Source
	now func() time.Time

	mu    sync.Mutex
	svids map[string]*SVID
}

// NewRotator returns a Rotator issuing from src.
func NewRotator(src Source) *Rotator {
	return &Rotator{src: src, now: time.Now, svids: map[string]*SVID{}}
}

// Source returns the Source the Rotator issues from.
func (r *Rotator) Source() Source { return r.src }

// SVIDs returns the current SVID of each of ids (same order), issuing a new one for an ID that
// has none or whose SVID reached its half-life; SVIDs of IDs not listed are forgotten. changed
// reports whether any SVID is new. It returns the first issuing error.
func (r *Rotator) SVIDs(ctx context.Context, ids []string) (svids []*SVID, changed bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	keep := make(map[string]*SVID, len(ids))
	svids = make([]*SVID, 0, len(ids))
	for _, id := range ids {
		s := r.svids[id]
		if s == nil || !now.Before(s.RenewAt()) {
			s, err = r.src.Issue(ctx, id)
			if err != nil {
				return nil, false, fmt.Errorf("rotate SVIDs: %w", err)
			}
			changed = true
		}
		keep[id] = s
		svids = append(svids, s)
	}
	if len(keep) != len(r.svids) {
		changed = true
	}
	r.svids = keep
	return svids, changed, nil
}

// Provider returns r as a Provider: the SVIDs of the pods' distinct SPIFFE IDs (Rotator.SVIDs),
// the Source's bundle, renewals at half-life, nothing changing on its own.
func (r *Rotator) Provider() Provider { return rotatorProvider{r} }

type rotatorProvider struct{ r *Rotator }

func (p rotatorProvider) NextRenewal() time.Time   { return p.r.NextRenewal() }
func (p rotatorProvider) Changed() <-chan struct{} { return nil }
func (p rotatorProvider) Lacks(string) bool        { return false }
func (p rotatorProvider) Bundles() map[string][]byte {
	return map[string][]byte{p.r.src.TrustDomain(): p.r.src.BundlePEM()}
}
func (p rotatorProvider) SVIDs(ctx context.Context, pods []Workload) (map[string]*SVID, bool, error) {
	return p.r.forPods(ctx, pods)
}

func (r *Rotator) forPods(ctx context.Context, pods []Workload) (map[string]*SVID, bool, error) {
	ids := make([]string, 0, len(pods))
	seen := make(map[string]bool, len(pods))
	for _, p := range pods {
		if !seen[p.SPIFFEID] {
			seen[p.SPIFFEID] = true
			ids = append(ids, p.SPIFFEID)
		}
	}
	svids, changed, err := r.SVIDs(ctx, ids)
	if err != nil {
		return nil, false, err
	}
	out := make(map[string]*SVID, len(svids))
	for _, s := range svids {
		out[s.SPIFFEID] = s
	}
	return out, changed, nil
}

// NextRenewal returns the earliest half-life time of the SVIDs held, or the zero time when none
// is held.
func (r *Rotator) NextRenewal() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var t time.Time
	for _, s := range r.svids {
		if ra := s.RenewAt(); t.IsZero() || ra.Before(t) {
			t = ra
		}
	}
	return t
}

package testenv

import (
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// EmbeddedEtcd is a single-member etcd server running inside the test process.
type EmbeddedEtcd struct {
	Etcd *embed.Etcd
	// Endpoints are the client URLs, e.g. ["http://127.0.0.1:43210"].
	Endpoints []string
	Dir       string
}

// StartEmbeddedEtcd starts a single-member etcd (go.etcd.io/etcd/server/v3/embed) on free loopback
// ports with its data in the test's temp dir, waits until it serves (up to 60 s) and stops it when
// the test ends. configure, when not nil, may change the config before start (auth, compaction,
// quotas). The server's log goes to etcd.log in its data dir.
func StartEmbeddedEtcd(t testing.TB, configure func(*embed.Config)) *EmbeddedEtcd {
	t.Helper()
	dir := t.TempDir()
	cfg := embed.NewConfig()
	cfg.Name = "default"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	cu := mustURL(t, fmt.Sprintf("http://127.0.0.1:%d", FreePort(t)))
	pu := mustURL(t, fmt.Sprintf("http://127.0.0.1:%d", FreePort(t)))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if configure != nil {
		configure(cfg)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("testenv: start embedded etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("testenv: embedded etcd: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatalf("testenv: embedded etcd not ready within 60s")
	}
	ee := &EmbeddedEtcd{Etcd: e, Dir: cfg.Dir}
	for _, u := range cfg.AdvertiseClientUrls {
		ee.Endpoints = append(ee.Endpoints, u.String())
	}
	return ee
}

func mustURL(t testing.TB, s string) url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return *u
}

//go:build !linux

package envoy

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// SupervisorConfig configures the Envoy supervisor (Linux only).
type SupervisorConfig struct {
	EnvoyPath              string
	Bootstrap              BootstrapConfig
	StateDir               string
	Prefix, ExtraArgs      []string
	MinBackoff, MaxBackoff time.Duration
	StableAfter            time.Duration
	CheckInterval          time.Duration
	Logger                 *slog.Logger
}

// Supervisor supervises Envoy; it is implemented on Linux only.
type Supervisor struct{}

// NewSupervisor returns an error: Envoy supervision needs Linux.
func NewSupervisor(SupervisorConfig) (*Supervisor, error) {
	return nil, errors.New("new supervisor: Linux only")
}

// Run returns an error: Envoy supervision needs Linux.
func (*Supervisor) Run(context.Context) error { return errors.New("supervise envoy: Linux only") }

// WaitLive returns an error: Envoy supervision needs Linux.
func (*Supervisor) WaitLive(context.Context) error { return errors.New("wait for envoy: Linux only") }

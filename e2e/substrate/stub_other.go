//go:build !linux

package substrate

import (
	"context"
	"errors"
	"log/slog"
)

// errNotLinux is returned by every effectful entry point off Linux.
var errNotLinux = errors.New("the substrate needs Linux (network and mount namespaces)")

// Substrate is a running substrate (Linux only).
type Substrate struct{}

// Options configure Start (Linux only).
type Options struct{}

// Start fails off Linux.
func Start(context.Context, Options) (*Substrate, error) { return nil, errNotLinux }

// Stop does nothing off Linux.
func (*Substrate) Stop() {}

// Clean fails off Linux.
func Clean(string, bool, *slog.Logger) ([]string, error) { return nil, errNotLinux }

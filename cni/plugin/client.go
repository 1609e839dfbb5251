package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	"github.com/containernetworking/cni/pkg/types"
)

// Client calls the agent's CNI API over its unix socket. It is what aether-cni uses; tests use it
// to drive a Server directly.
type Client struct {
	// Socket is the agent's unix socket path.
	Socket string
	hc     *http.Client
}

// NewClient returns a client for the agent listening on socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}
	return &Client{Socket: socket, hc: &http.Client{Transport: tr}}
}

// ErrAgentUnavailable is wrapped by every error that means the agent could not be reached (no
// socket, connection refused, no answer before the deadline).
var ErrAgentUnavailable = errors.New("aether agent unavailable")

// Add asks the agent to capture the pod (PathAdd). It returns once the agent has installed
// capture and Envoy has accepted the pod's listeners, or an error (a *types.Error carrying the
// agent's CNI error code, or one wrapping ErrAgentUnavailable).
func (c *Client) Add(ctx context.Context, req cniv1.Request) (cniv1.Response, error) {
	var resp cniv1.Response
	err := c.call(ctx, http.MethodPost, cniv1.PathAdd, req, &resp)
	return resp, err
}

// Del asks the agent to undo everything it did for the attachment (PathDel); idempotent.
func (c *Client) Del(ctx context.Context, req cniv1.Request) error {
	return c.call(ctx, http.MethodPost, cniv1.PathDel, req, nil)
}

// Check asks the agent whether the attachment's capture is intact (PathCheck).
func (c *Client) Check(ctx context.Context, req cniv1.Request) error {
	return c.call(ctx, http.MethodPost, cniv1.PathCheck, req, nil)
}

// GC asks the agent to remove every attachment of req.Network not in req.ValidAttachments.
func (c *Client) GC(ctx context.Context, req cniv1.Request) error {
	return c.call(ctx, http.MethodPost, cniv1.PathGC, req, nil)
}

// Status asks whether the agent is ready to capture pods (PathStatus).
func (c *Client) Status(ctx context.Context) error {
	return c.call(ctx, http.MethodGet, cniv1.PathStatus, nil, nil)
}

func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode agent request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://aether-agent"+path, body)
	if err != nil {
		return fmt.Errorf("build agent request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("call agent at %s: %w: %w", c.Socket, ErrAgentUnavailable, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("read agent answer: %w: %w", ErrAgentUnavailable, err)
	}
	if resp.StatusCode/100 != 2 {
		var e cniv1.ErrorResponse
		if json.Unmarshal(b, &e) != nil || e.Message == "" {
			return types.NewError(types.ErrInternal, fmt.Sprintf("agent answered %s", resp.Status), string(b))
		}
		return types.NewError(e.Code, e.Message, e.Details)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("decode agent answer: %w", err)
		}
	}
	return nil
}

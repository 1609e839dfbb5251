package cni

import "github.com/aethermesh/aether/cni/plugin"

// The wire protocol between aether-cni and the agent lives in package plugin (so the plugin
// binary stays small); these aliases let agent code name it from here.
type (
	// Request is plugin.Request.
	Request = plugin.Request
	// Response is plugin.Response.
	Response = plugin.Response
	// ErrorResponse is plugin.ErrorResponse.
	ErrorResponse = plugin.ErrorResponse
	// CaptureOptions is plugin.CaptureOptions.
	CaptureOptions = plugin.CaptureOptions
	// Attachment is plugin.Attachment.
	Attachment = plugin.Attachment
	// Client is plugin.Client.
	Client = plugin.Client
)

// Paths and names of the protocol (see package plugin).
const (
	PathAdd            = plugin.PathAdd
	PathDel            = plugin.PathDel
	PathCheck          = plugin.PathCheck
	PathGC             = plugin.PathGC
	PathStatus         = plugin.PathStatus
	DefaultAgentSocket = plugin.DefaultAgentSocket
	PluginName         = plugin.PluginName
)

// NewClient returns a client for the agent listening on socket (plugin.NewClient).
func NewClient(socket string) *Client { return plugin.NewClient(socket) }

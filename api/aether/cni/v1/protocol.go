package cniv1

import (
	"net/netip"
)

// Paths of the agent's CNI API, served over HTTP on the agent's unix socket (DefaultAgentSocket).
// Every request is a POST of a Request (GET for status); a failure answers a non-2xx status with
// an ErrorResponse body.
const (
	PathAdd    = "/v1/cni/add"
	PathDel    = "/v1/cni/del"
	PathCheck  = "/v1/cni/check"
	PathGC     = "/v1/cni/gc"
	PathStatus = "/v1/cni/status"
)

// DefaultAgentSocket is the agent's CNI socket when the plugin config names none.
const DefaultAgentSocket = "/var/run/aether/cni.sock"

// PodAttachment is what a CNI ADD tells the agent about a pod (DESIGN.md, pod attachment
// contract). The agent persists it in its node-local state directory so that repair after an
// agent restart knows every pod's netns path; the model joins it with the pod's Kubernetes
// metadata into a model.LocalPod.
type PodAttachment struct {
	// ContainerID is CNI_CONTAINERID (the pod sandbox's infra container).
	ContainerID string `json:"containerID"`
	// PodUID, Namespace and Name come from CNI_ARGS K8S_POD_UID, K8S_POD_NAMESPACE, K8S_POD_NAME.
	PodUID    string `json:"podUID"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// NetnsPath is CNI_NETNS.
	NetnsPath string `json:"netnsPath"`
	// IPs are the pod's addresses from the prevResult.
	IPs []netip.Addr `json:"ips"`
	// Interface is CNI_IFNAME (usually eth0).
	Interface string `json:"interface"`
}

// Request is what aether-cni sends the agent for ADD, DEL, CHECK and GC.
type Request struct {
	// Network is the conflist's name (CNI spec: network configuration "name").
	Network string `json:"network"`
	// Attachment is the pod's attachment (DESIGN.md, pod attachment contract).
	Attachment PodAttachment `json:"attachment"`
	// Gateways are the gateway addresses of the pod's IPs in the prevResult: the node side of the
	// pod's link, trusted in strict mode as the node's own connections.
	Gateways []netip.Addr `json:"gateways,omitempty"`
	// Capture carries the capture settings from the plugin config.
	Capture CaptureOptions `json:"capture"`
	// ValidAttachments is GC's list of attachments to keep (CNI spec 1.1, GC:
	// cni.dev/valid-attachments); every other attachment of Network is removed.
	ValidAttachments []Attachment `json:"validAttachments,omitempty"`
}

// Attachment names one attachment by container ID and interface (CNI spec: an attachment is
// identified by CNI_CONTAINERID and CNI_IFNAME).
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

// CaptureOptions are the per-network capture settings the plugin config carries. The agent adds
// its own node-wide settings (HOST_IP, cluster DNS) when it builds the rules.
type CaptureOptions struct {
	// InboundMode is "strict", "permissive" or "" (the agent's default).
	InboundMode          string         `json:"inboundMode,omitempty"`
	ExcludeOutboundPorts []uint16       `json:"excludeOutboundPorts,omitempty"`
	ExcludeInboundPorts  []uint16       `json:"excludeInboundPorts,omitempty"`
	ExcludeOutboundCIDRs []netip.Prefix `json:"excludeOutboundCIDRs,omitempty"`
}

// Response is the agent's answer to a successful ADD.
type Response struct {
	// Captured is false when the agent left the pod alone (not in the mesh: namespace not opted
	// in, or the pod opted out).
	Captured bool `json:"captured"`
	// Reason says why the pod was not captured.
	Reason string `json:"reason,omitempty"`
}

// ErrorResponse is the body of a failed request. Code is a CNI error code (CNI spec, error
// codes: 11 try again later, 50 plugin not available, 999 internal).
type ErrorResponse struct {
	Code    uint   `json:"code"`
	Message string `json:"msg"`
	Details string `json:"details,omitempty"`
}

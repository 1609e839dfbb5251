package plugin

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// PluginName is aether-cni's "type" in a conflist.
const PluginName = "aether-cni"

// SupportedVersions are the CNI spec versions aether-cni accepts: 0.3.1 (what kube-flannel
// writes), 0.4.0, 1.0.0 and 1.1.0.
var SupportedVersions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// PluginConf is aether-cni's network configuration (its entry in the conflist, plus what the
// runtime injects: name, cniVersion, prevResult, cni.dev/valid-attachments).
type PluginConf struct {
	types.PluginConf
	// AgentSocket is the agent's CNI unix socket (default DefaultAgentSocket).
	AgentSocket string `json:"agentSocket,omitempty"`
	// TimeoutSeconds bounds a whole call to the agent, including its wait for Envoy's ACK
	// (default 30).
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
	// LogFile receives the plugin's logs (JSON lines); empty means stderr. Never stdout.
	LogFile string `json:"logFile,omitempty"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `json:"logLevel,omitempty"`
	// ExcludeNamespaces are namespaces whose pods are passed through without asking the agent.
	// Default ["kube-system"]; an explicit empty list excludes none.
	ExcludeNamespaces *[]string `json:"excludeNamespaces,omitempty"`
	// InboundMode is "strict", "permissive" or "" (the agent's default).
	InboundMode string `json:"inboundMode,omitempty"`
	// ExcludeOutboundPorts are TCP ports (1-65535) never captured outbound.
	ExcludeOutboundPorts []int `json:"excludeOutboundPorts,omitempty"`
	// ExcludeInboundPorts are TCP ports accepted in plaintext even in strict mode.
	ExcludeInboundPorts []int `json:"excludeInboundPorts,omitempty"`
	// ExcludeOutboundCIDRs are destination prefixes never captured ("169.254.169.254/32").
	ExcludeOutboundCIDRs []string `json:"excludeOutboundCIDRs,omitempty"`

	// Attachments is the GC list under the name the CNI spec text first gave it
	// ("cni.dev/attachments", containernetworking/cni#1101); libcni sends it beside
	// cni.dev/valid-attachments. It is read only when cni.dev/valid-attachments is absent.
	Attachments []types.GCAttachment `json:"cni.dev/attachments,omitempty"`

	// Derived by parseConfig.
	// valid is GC's list of still valid attachments; validSet reports whether the input had
	// one (an explicit empty list or null is one; an absent key is not).
	valid    []types.GCAttachment
	validSet bool
	capture  cniv1.CaptureOptions
	timeout  time.Duration
	excluded []string
	prev     *current.Result
}

// parseConfig is the one place the plugin reads its stdin: it unmarshals, checks cniVersion,
// parses the prevResult (required when needPrev, CNI spec: chained plugins get prevResult on ADD
// and CHECK), applies defaults and validates every field. An invalid field is an error naming it
// and its value.
func parseConfig(stdin []byte, needPrev bool) (*PluginConf, error) {
	conf := &PluginConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &keys); err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	if _, ok := keys["cni.dev/valid-attachments"]; ok {
		conf.valid, conf.validSet = conf.ValidAttachments, true
	} else if _, ok := keys["cni.dev/attachments"]; ok {
		conf.valid, conf.validSet = conf.Attachments, true
	}
	if !slices.Contains(SupportedVersions, conf.CNIVersion) {
		return nil, fmt.Errorf("parse config: cniVersion %q: want one of %s", conf.CNIVersion, strings.Join(SupportedVersions, ", "))
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
			return nil, fmt.Errorf("parse config: prevResult: %w", err)
		}
		prev, err := current.NewResultFromResult(conf.PrevResult)
		if err != nil {
			return nil, fmt.Errorf("parse config: prevResult: %w", err)
		}
		conf.prev = prev
	} else if needPrev {
		return nil, fmt.Errorf("parse config: prevResult: missing; %s must run chained after the primary CNI plugin", PluginName)
	}
	if conf.AgentSocket == "" {
		conf.AgentSocket = cniv1.DefaultAgentSocket
	}
	if !strings.HasPrefix(conf.AgentSocket, "/") {
		return nil, fmt.Errorf("parse config: agentSocket %q: want an absolute path", conf.AgentSocket)
	}
	switch {
	case conf.TimeoutSeconds == 0:
		conf.timeout = 30 * time.Second
	case conf.TimeoutSeconds < 0 || conf.TimeoutSeconds > 600:
		return nil, fmt.Errorf("parse config: timeoutSeconds %d: want 1-600", conf.TimeoutSeconds)
	default:
		conf.timeout = time.Duration(conf.TimeoutSeconds) * time.Second
	}
	switch conf.LogLevel {
	case "", "debug", "info", "warn", "error":
	default:
		return nil, fmt.Errorf("parse config: logLevel %q: want debug, info, warn or error", conf.LogLevel)
	}
	switch conf.InboundMode {
	case "", "strict", "permissive":
	default:
		return nil, fmt.Errorf("parse config: inboundMode %q: want strict or permissive", conf.InboundMode)
	}
	conf.capture.InboundMode = conf.InboundMode
	var err error
	if conf.capture.ExcludeOutboundPorts, err = ports("excludeOutboundPorts", conf.ExcludeOutboundPorts); err != nil {
		return nil, err
	}
	if conf.capture.ExcludeInboundPorts, err = ports("excludeInboundPorts", conf.ExcludeInboundPorts); err != nil {
		return nil, err
	}
	for _, s := range conf.ExcludeOutboundCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("parse config: excludeOutboundCIDRs: %q: %w", s, err)
		}
		conf.capture.ExcludeOutboundCIDRs = append(conf.capture.ExcludeOutboundCIDRs, p.Masked())
	}
	if conf.ExcludeNamespaces == nil {
		conf.excluded = []string{"kube-system"}
	} else {
		conf.excluded = *conf.ExcludeNamespaces
	}
	for _, ns := range conf.excluded {
		if ns == "" {
			return nil, fmt.Errorf("parse config: excludeNamespaces: empty namespace name")
		}
	}
	return conf, nil
}

func ports(field string, in []int) ([]uint16, error) {
	var out []uint16
	for _, p := range in {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("parse config: %s: port %d: want 1-65535", field, p)
		}
		out = append(out, uint16(p))
	}
	return out, nil
}

// K8sArgs is the pod identity the kubelet passes in CNI_ARGS.
type K8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString
	K8S_POD_NAME               types.UnmarshallableString
	K8S_POD_UID                types.UnmarshallableString
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString
}

// parseK8sArgs reads the pod identity from CNI_ARGS. Namespace and name are required (aether-cni
// only captures Kubernetes pods and fails closed without them); the UID is optional for old
// runtimes.
func parseK8sArgs(args string) (K8sArgs, error) {
	k := K8sArgs{}
	k.IgnoreUnknown = true
	if err := types.LoadArgs(args, &k); err != nil {
		return k, fmt.Errorf("parse CNI_ARGS: %w", err)
	}
	if k.K8S_POD_NAMESPACE == "" || k.K8S_POD_NAME == "" {
		return k, fmt.Errorf("parse CNI_ARGS: K8S_POD_NAMESPACE and K8S_POD_NAME are required, got %q", args)
	}
	return k, nil
}

package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// Agent is what the plugin needs from the agent; *Client implements it. Tests inject their own.
type Agent interface {
	Add(ctx context.Context, req cniv1.Request) (cniv1.Response, error)
	Del(ctx context.Context, req cniv1.Request) error
	Check(ctx context.Context, req cniv1.Request) error
	GC(ctx context.Context, req cniv1.Request) error
	Status(ctx context.Context) error
}

// Plugin is aether-cni's command logic. The zero value talks to the agent named in the config
// (NewClient) and prints results on os.Stdout.
type Plugin struct {
	// Stdout receives the CNI result and nothing else (default os.Stdout).
	Stdout io.Writer
	// Stderr receives logs when the config names no log file (default os.Stderr).
	Stderr io.Writer
	// NewAgent returns the agent client for a socket path (default NewClient).
	NewAgent func(socket string) Agent
}

// Funcs returns the CNI commands for skel.PluginMainFuncsWithError (CNI spec 1.1: ADD, DEL,
// CHECK, GC, STATUS; VERSION is answered before skel runs, by ServeVersion, because skel
// ignores the request's cniVersion).
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.cmdAdd, Del: p.cmdDel, Check: p.cmdCheck, GC: p.cmdGC, Status: p.cmdStatus}
}

func (p *Plugin) stdout() io.Writer {
	if p.Stdout != nil {
		return p.Stdout
	}
	return os.Stdout
}

func (p *Plugin) agent(socket string) Agent {
	if p.NewAgent != nil {
		return p.NewAgent(socket)
	}
	return NewClient(socket)
}

// logger returns the invocation's logger (the config's log file, else stderr) and its closer.
func (p *Plugin) logger(conf *PluginConf, args *skel.CmdArgs, cmd string) (*slog.Logger, func()) {
	var w io.Writer = os.Stderr
	if p.Stderr != nil {
		w = p.Stderr
	}
	closer := func() {}
	if conf != nil && conf.LogFile != "" {
		if f, err := os.OpenFile(conf.LogFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600); err == nil {
			w, closer = f, func() { f.Close() }
		}
	}
	level := slog.LevelInfo
	if conf != nil {
		_ = level.UnmarshalText([]byte(conf.LogLevel))
	}
	l := slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})).With("plugin", PluginName, "cmd", cmd)
	if args != nil && args.ContainerID != "" {
		l = l.With("containerID", args.ContainerID)
	}
	return l, closer
}

// request builds the agent request for a command from the parsed config and CNI_ARGS.
func request(conf *PluginConf, args *skel.CmdArgs, k K8sArgs) cniv1.Request {
	req := cniv1.Request{
		Network: conf.Name,
		Attachment: cniv1.PodAttachment{
			ContainerID: args.ContainerID, PodUID: string(k.K8S_POD_UID), Namespace: string(k.K8S_POD_NAMESPACE),
			Name: string(k.K8S_POD_NAME), NetnsPath: args.Netns, Interface: args.IfName,
		},
		Capture: conf.capture,
	}
	if conf.prev != nil {
		for _, ip := range conf.prev.IPs {
			if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
				req.Attachment.IPs = append(req.Attachment.IPs, a.Unmap())
			}
			if g, ok := netip.AddrFromSlice(ip.Gateway); ok && g.IsValid() && !g.IsUnspecified() {
				req.Gateways = append(req.Gateways, g.Unmap())
			}
		}
	}
	return req
}

// cmdAdd is ADD (CNI spec 1.1, section "ADD"): parse, pass excluded namespaces through, else
// hand the pod to doAdd; on success print the prevResult unchanged.
func (p *Plugin) cmdAdd(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, true)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	log, done := p.logger(conf, args, "ADD")
	defer done()
	k, err := parseK8sArgs(args.Args)
	if err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	if err := p.doAdd(conf, args, k, log); err != nil {
		log.Error("ADD failed", "pod", string(k.K8S_POD_NAMESPACE)+"/"+string(k.K8S_POD_NAME), "err", err)
		return err
	}
	// The result is the prevResult, unchanged, in the config's version (it already is).
	res, err := conf.PrevResult.GetAsVersion(conf.CNIVersion)
	if err != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, "print prevResult", err.Error())
	}
	return res.PrintTo(p.stdout())
}

// doAdd asks the agent to capture the pod unless its namespace is excluded. The whole call is
// bounded by the config's timeout; an unreachable agent is ErrTryAgainLater (fail closed).
func (p *Plugin) doAdd(conf *PluginConf, args *skel.CmdArgs, k K8sArgs, log *slog.Logger) error {
	ns := string(k.K8S_POD_NAMESPACE)
	if slices.Contains(conf.excluded, ns) {
		log.Debug("namespace excluded: passing through", "namespace", ns)
		return nil
	}
	req := request(conf, args, k)
	if len(req.Attachment.IPs) == 0 {
		return types.NewError(types.ErrInvalidNetworkConfig, "prevResult: no IP addresses to capture", "")
	}
	ctx, cancel := context.WithTimeout(context.Background(), conf.timeout)
	defer cancel()
	resp, err := p.agent(conf.AgentSocket).Add(ctx, req)
	if err != nil {
		return agentError("capture pod", err)
	}
	log.Info("pod attached", "pod", ns+"/"+string(k.K8S_POD_NAME), "captured", resp.Captured, "reason", resp.Reason)
	return nil
}

// cmdDel is DEL (CNI spec 1.1, section "DEL"): idempotent. When the agent cannot be reached DEL
// still succeeds: the rules die with the netns and the agent's repair drops the attachment of a
// netns that is gone, so a failing DEL would only block the runtime. A DEL without pod identity
// in CNI_ARGS (optional on DEL) is still sent, by container ID and interface.
func (p *Plugin) cmdDel(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, false)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	log, done := p.logger(conf, args, "DEL")
	defer done()
	k, err := parseK8sArgs(args.Args)
	if err != nil {
		// CNI_ARGS is optional on DEL (CNI spec 1.1, DEL): the agent still releases the
		// attachment by container ID and interface, which is all it needs. Without the
		// namespace, excluded pods cannot be told apart, and DEL must succeed for attachments
		// that were never ours, so a failure is only logged.
		log.Debug("DEL without pod identity: releasing by container ID", "err", err)
		ctx, cancel := context.WithTimeout(context.Background(), conf.timeout)
		defer cancel()
		if err := p.agent(conf.AgentSocket).Del(ctx, request(conf, args, K8sArgs{})); err != nil {
			log.Warn("DEL without pod identity: agent did not release the attachment; left to its repair", "err", err)
		}
		return nil
	}
	if slices.Contains(conf.excluded, string(k.K8S_POD_NAMESPACE)) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), conf.timeout)
	defer cancel()
	if err := p.agent(conf.AgentSocket).Del(ctx, request(conf, args, k)); err != nil {
		if errors.Is(err, ErrAgentUnavailable) {
			log.Warn("agent unavailable; DEL left to the agent's repair", "err", err)
			return nil
		}
		return agentError("release pod", err)
	}
	return nil
}

// cmdCheck is CHECK (CNI spec 1.1, section "CHECK"): the prevResult is required and the agent
// verifies the attachment and its rules.
func (p *Plugin) cmdCheck(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, true)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	_, done := p.logger(conf, args, "CHECK")
	defer done()
	k, err := parseK8sArgs(args.Args)
	if err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	if slices.Contains(conf.excluded, string(k.K8S_POD_NAMESPACE)) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), conf.timeout)
	defer cancel()
	if err := p.agent(conf.AgentSocket).Check(ctx, request(conf, args, k)); err != nil {
		return agentError("check pod", err)
	}
	return nil
}

// cmdGC is GC (CNI spec 1.1, section "GC"): the agent drops every attachment of this network
// not listed in cni.dev/valid-attachments (or its first spelling, cni.dev/attachments). The spec
// requires the list; a GC without it is refused (ErrInvalidNetworkConfig naming the key), since
// reading "no list" as "nothing is valid" would strip capture from every pod of the network on
// the node. An explicit empty list (or null) is honoured: the runtime has no attachment left.
func (p *Plugin) cmdGC(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, false)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	log, done := p.logger(conf, args, "GC")
	defer done()
	if !conf.validSet {
		msg := "parse config: cni.dev/valid-attachments: missing; GC needs the runtime's list of still valid attachments (CNI spec 1.1, GC)"
		log.Error("GC refused", "err", msg)
		return types.NewError(types.ErrInvalidNetworkConfig, msg, "")
	}
	req := cniv1.Request{Network: conf.Name, ValidAttachments: []cniv1.Attachment{}}
	for _, a := range conf.valid {
		req.ValidAttachments = append(req.ValidAttachments, cniv1.Attachment{ContainerID: a.ContainerID, IfName: a.IfName})
	}
	ctx, cancel := context.WithTimeout(context.Background(), conf.timeout)
	defer cancel()
	if err := p.agent(conf.AgentSocket).GC(ctx, req); err != nil {
		return agentError("collect garbage", err)
	}
	return nil
}

// cmdStatus is STATUS (CNI spec 1.1, section "STATUS"): ErrPluginNotAvailable (50) while the
// agent is unreachable or not ready.
func (p *Plugin) cmdStatus(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData, false)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	ctx, cancel := context.WithTimeout(context.Background(), conf.timeout)
	defer cancel()
	if err := p.agent(conf.AgentSocket).Status(ctx); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "aether agent not ready", err.Error())
	}
	return nil
}

// agentError turns an agent call failure into a CNI error: the agent's own *types.Error is kept,
// an unreachable agent becomes ErrTryAgainLater naming the cause.
func agentError(what string, err error) error {
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	if errors.Is(err, ErrAgentUnavailable) {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%s: aether agent unavailable", what), err.Error())
	}
	return types.NewError(types.ErrInternal, what, err.Error())
}

package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// fakeAgent records requests and answers with err (a fake at the plugin's boundary; the real
// agent is exercised by package cni's privileged tests).
type fakeAgent struct {
	reqs []cniv1.Request
	err  error
}

func (f *fakeAgent) Add(_ context.Context, r cniv1.Request) (cniv1.Response, error) {
	f.reqs = append(f.reqs, r)
	return cniv1.Response{Captured: true}, f.err
}
func (f *fakeAgent) Del(_ context.Context, r cniv1.Request) error {
	f.reqs = append(f.reqs, r)
	return f.err
}
func (f *fakeAgent) Check(_ context.Context, r cniv1.Request) error {
	f.reqs = append(f.reqs, r)
	return f.err
}
func (f *fakeAgent) GC(_ context.Context, r cniv1.Request) error {
	f.reqs = append(f.reqs, r)
	return f.err
}
func (f *fakeAgent) Status(context.Context) error { return f.err }

func newArgs(t *testing.T, ns string, extra string) (*skel.CmdArgs, string) {
	logFile := filepath.Join(t.TempDir(), "cni.log")
	conf := `{"cniVersion":"1.0.0","name":"n","type":"aether-cni","logFile":"` + logFile + `",` + extra + `
	"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],
	"ips":[{"address":"10.244.1.5/24","gateway":"10.244.1.1","interface":0}]}}`
	return &skel.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/x", IfName: "eth0",
		Args: "K8S_POD_NAMESPACE=" + ns + ";K8S_POD_NAME=p;K8S_POD_UID=u1", StdinData: []byte(conf)}, logFile
}

func TestPluginAdd(t *testing.T) {
	agent := &fakeAgent{}
	var out bytes.Buffer
	p := &Plugin{Stdout: &out, NewAgent: func(string) Agent { return agent }}
	args, logFile := newArgs(t, "mesh", `"excludeOutboundPorts":[22],"inboundMode":"permissive",`)
	if err := p.cmdAdd(args); err != nil {
		t.Fatal(err)
	}
	if len(agent.reqs) != 1 {
		t.Fatalf("agent got %d requests", len(agent.reqs))
	}
	r := agent.reqs[0]
	a := r.Attachment
	if a.ContainerID != "c1" || a.Namespace != "mesh" || a.Name != "p" || a.PodUID != "u1" || a.NetnsPath != "/var/run/netns/x" ||
		a.Interface != "eth0" || len(a.IPs) != 1 || a.IPs[0].String() != "10.244.1.5" || len(r.Gateways) != 1 ||
		r.Capture.InboundMode != "permissive" || r.Capture.ExcludeOutboundPorts[0] != 22 || r.Network != "n" {
		t.Fatalf("request = %+v", r)
	}
	// stdout holds exactly the prevResult; the log went to the log file.
	var got, want map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("stdout is not one JSON result: %q", out.String())
	}
	var conf map[string]any
	_ = json.Unmarshal(args.StdinData, &conf)
	want = conf["prevResult"].(map[string]any)
	if fmt.Sprint(got["ips"]) != fmt.Sprint(want["ips"]) || fmt.Sprint(got["interfaces"]) != fmt.Sprint(want["interfaces"]) {
		t.Fatalf("stdout = %v, want the prevResult %v", got, want)
	}
	if b, _ := os.ReadFile(logFile); !strings.Contains(string(b), "pod attached") {
		t.Fatalf("log file = %q", b)
	}
}

func TestPluginExcludedNamespace(t *testing.T) {
	agent := &fakeAgent{}
	var out bytes.Buffer
	p := &Plugin{Stdout: &out, NewAgent: func(string) Agent { return agent }}
	args, _ := newArgs(t, "kube-system", "")
	if err := p.cmdAdd(args); err != nil {
		t.Fatal(err)
	}
	if err := p.cmdDel(args); err != nil {
		t.Fatal(err)
	}
	if len(agent.reqs) != 0 || out.Len() == 0 {
		t.Fatalf("kube-system: agent got %d requests, stdout %q", len(agent.reqs), out.String())
	}
}

func TestPluginAgentUnavailable(t *testing.T) {
	down := fmt.Errorf("dial: %w", ErrAgentUnavailable)
	p := &Plugin{Stdout: &bytes.Buffer{}, NewAgent: func(string) Agent { return &fakeAgent{err: down} }}
	args, _ := newArgs(t, "mesh", "")
	var te *types.Error
	if err := p.cmdAdd(args); !errors.As(err, &te) || te.Code != types.ErrTryAgainLater {
		t.Fatalf("ADD with the agent down = %v, want code 11", err)
	}
	if err := p.cmdCheck(args); !errors.As(err, &te) || te.Code != types.ErrTryAgainLater {
		t.Fatalf("CHECK with the agent down = %v, want code 11", err)
	}
	if err := p.cmdStatus(args); !errors.As(err, &te) || te.Code != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS with the agent down = %v, want code 50", err)
	}
	if err := p.cmdDel(args); err != nil {
		t.Fatalf("DEL with the agent down = %v, want success", err)
	}
	// An error the agent answered keeps its code.
	p.NewAgent = func(string) Agent { return &fakeAgent{err: types.NewError(types.ErrUnknownContainer, "unknown", "")} }
	if err := p.cmdCheck(args); !errors.As(err, &te) || te.Code != types.ErrUnknownContainer {
		t.Fatalf("CHECK = %v, want the agent's code 3", err)
	}
	// Missing pod identity fails ADD (fail closed) but not DEL.
	args.Args = "K8S_POD_NAME=p"
	if err := p.cmdAdd(args); !errors.As(err, &te) || te.Code != types.ErrInvalidEnvironmentVariables {
		t.Fatalf("ADD without namespace = %v, want code 4", err)
	}
	if err := p.cmdDel(args); err != nil {
		t.Fatalf("DEL without pod identity = %v", err)
	}
}

func TestPluginGC(t *testing.T) {
	agent := &fakeAgent{}
	p := &Plugin{NewAgent: func(string) Agent { return agent }}
	args := &skel.CmdArgs{StdinData: []byte(`{"cniVersion":"1.1.0","name":"n","type":"aether-cni",
		"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]}`)}
	if err := p.cmdGC(args); err != nil {
		t.Fatal(err)
	}
	if len(agent.reqs) != 1 || len(agent.reqs[0].ValidAttachments) != 1 || agent.reqs[0].ValidAttachments[0] != (cniv1.Attachment{ContainerID: "c1", IfName: "eth0"}) {
		t.Fatalf("GC request = %+v", agent.reqs)
	}
}

// TestPluginGCWithoutValidAttachments: a GC whose config has no cni.dev/valid-attachments (a
// hand-run GC, a runtime that does not send it) is refused with an error naming the key, and
// the agent is not called; before, it was sent as "nothing is valid" and the agent released
// every attachment of the network: capture and listeners gone from every pod on the node. The
// spec's first spelling, cni.dev/attachments, and an explicit empty list or null are honoured.
func TestPluginGCWithoutValidAttachments(t *testing.T) {
	gc := func(extra string) ([]cniv1.Request, error) {
		agent := &fakeAgent{}
		p := &Plugin{Stderr: &bytes.Buffer{}, NewAgent: func(string) Agent { return agent }}
		err := p.cmdGC(&skel.CmdArgs{StdinData: []byte(`{"cniVersion":"1.1.0","name":"n","type":"aether-cni"` + extra + `}`)})
		return agent.reqs, err
	}
	reqs, err := gc("")
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrInvalidNetworkConfig || !strings.Contains(te.Msg, "cni.dev/valid-attachments") {
		t.Fatalf("GC without cni.dev/valid-attachments = %v, want code 1 naming the key", err)
	}
	if len(reqs) != 0 {
		t.Fatalf("GC without cni.dev/valid-attachments called the agent: %+v", reqs)
	}
	for _, c := range []struct {
		extra string
		want  int
	}{
		{`,"cni.dev/attachments":[{"containerID":"c1","ifname":"eth0"}]`, 1},
		{`,"cni.dev/valid-attachments":[]`, 0},
		{`,"cni.dev/valid-attachments":null`, 0},
	} {
		reqs, err := gc(c.extra)
		if err != nil || len(reqs) != 1 || len(reqs[0].ValidAttachments) != c.want {
			t.Errorf("GC with %s = %+v, %v; want one agent call keeping %d", c.extra, reqs, err, c.want)
		}
	}
}

// TestPluginDelWithoutPodIdentity: CNI_ARGS is optional on DEL (CNI spec 1.1), and the agent
// releases an attachment by container ID and interface alone, so a DEL without the pod's
// identity still reaches it. Before, the plugin returned at once, leaving the pod's capture
// rules, Envoy listeners and record behind until a repair found its netns gone (never, for a
// netns the runtime keeps). A failure of such a DEL is logged, not returned (the attachment may
// never have been ours).
func TestPluginDelWithoutPodIdentity(t *testing.T) {
	agent := &fakeAgent{}
	p := &Plugin{Stderr: &bytes.Buffer{}, NewAgent: func(string) Agent { return agent }}
	args, _ := newArgs(t, "mesh", "")
	args.Args = ""
	if err := p.cmdDel(args); err != nil {
		t.Fatal(err)
	}
	if len(agent.reqs) != 1 || agent.reqs[0].Attachment.ContainerID != "c1" || agent.reqs[0].Attachment.Interface != "eth0" {
		t.Fatalf("DEL without CNI_ARGS sent %+v, want one request for c1/eth0", agent.reqs)
	}
	agent.err = types.NewError(types.ErrInternal, "boom", "")
	if err := p.cmdDel(args); err != nil {
		t.Fatalf("DEL without CNI_ARGS, agent failing = %v, want success", err)
	}
}

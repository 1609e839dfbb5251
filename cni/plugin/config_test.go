package plugin

import (
	"strings"
	"testing"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
)

const prev031 = `"prevResult": {"cniVersion": "0.3.1", "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
  "ips": [{"version": "4", "address": "10.244.1.5/24", "gateway": "10.244.1.1", "interface": 0}]}`

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		name     string
		conf     string
		needPrev bool
		field    string // empty: valid
		check    func(t *testing.T, c *PluginConf)
	}{
		{name: "defaults", conf: `{"cniVersion":"0.3.1","name":"cbr0","type":"aether-cni",` + prev031 + `}`, needPrev: true,
			check: func(t *testing.T, c *PluginConf) {
				if c.AgentSocket != cniv1.DefaultAgentSocket || c.timeout.Seconds() != 30 || len(c.excluded) != 1 || c.excluded[0] != "kube-system" {
					t.Fatalf("defaults: %+v", c)
				}
				if c.prev == nil || len(c.prev.IPs) != 1 || c.prev.IPs[0].Address.String() != "10.244.1.5/24" {
					t.Fatalf("prevResult: %+v", c.prev)
				}
			}},
		{name: "all fields", conf: `{"cniVersion":"1.1.0","name":"n","type":"aether-cni","agentSocket":"/run/a.sock","timeoutSeconds":5,
			"logLevel":"debug","inboundMode":"permissive","excludeNamespaces":[],"excludeOutboundPorts":[22,5432],
			"excludeInboundPorts":[9090],"excludeOutboundCIDRs":["169.254.169.254/32","10.0.0.1/8"]}`,
			check: func(t *testing.T, c *PluginConf) {
				if len(c.excluded) != 0 || c.capture.InboundMode != "permissive" || len(c.capture.ExcludeOutboundPorts) != 2 ||
					c.capture.ExcludeOutboundCIDRs[1].String() != "10.0.0.0/8" || c.capture.ExcludeInboundPorts[0] != 9090 {
					t.Fatalf("parsed: %+v", c)
				}
			}},
		{name: "not chained", conf: `{"cniVersion":"1.0.0","name":"n","type":"aether-cni"}`, needPrev: true, field: "prevResult"},
		{name: "bad version", conf: `{"cniVersion":"0.2.0","name":"n","type":"aether-cni"}`, field: "cniVersion"},
		{name: "relative socket", conf: `{"cniVersion":"1.0.0","agentSocket":"a.sock"}`, field: "agentSocket"},
		{name: "timeout", conf: `{"cniVersion":"1.0.0","timeoutSeconds":-1}`, field: "timeoutSeconds"},
		{name: "log level", conf: `{"cniVersion":"1.0.0","logLevel":"loud"}`, field: "logLevel"},
		{name: "mode", conf: `{"cniVersion":"1.0.0","inboundMode":"open"}`, field: "inboundMode"},
		{name: "port", conf: `{"cniVersion":"1.0.0","excludeOutboundPorts":[70000]}`, field: "excludeOutboundPorts"},
		{name: "inbound port", conf: `{"cniVersion":"1.0.0","excludeInboundPorts":[0]}`, field: "excludeInboundPorts"},
		{name: "cidr", conf: `{"cniVersion":"1.0.0","excludeOutboundCIDRs":["10.0.0.0/33"]}`, field: "excludeOutboundCIDRs"},
		{name: "namespace", conf: `{"cniVersion":"1.0.0","excludeNamespaces":[""]}`, field: "excludeNamespaces"},
		{name: "bad prevResult", conf: `{"cniVersion":"1.0.0","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"nope"}]}}`, field: "prevResult"},
		{name: "not json", conf: `{`, field: "parse config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConfig([]byte(tc.conf), tc.needPrev)
			if tc.field != "" {
				if err == nil || !strings.Contains(err.Error(), tc.field) {
					t.Fatalf("parseConfig = %v, want an error naming %s", err, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestParseK8sArgs(t *testing.T) {
	k, err := parseK8sArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u;K8S_POD_INFRA_CONTAINER_ID=c;OTHER=x")
	if err != nil || k.K8S_POD_NAMESPACE != "ns" || k.K8S_POD_NAME != "p" || k.K8S_POD_UID != "u" || k.K8S_POD_INFRA_CONTAINER_ID != "c" {
		t.Fatalf("parseK8sArgs = %+v, %v", k, err)
	}
	if _, err := parseK8sArgs("K8S_POD_NAME=p"); err == nil || !strings.Contains(err.Error(), "K8S_POD_NAMESPACE") {
		t.Fatalf("missing namespace: %v", err)
	}
}

// FuzzParseConfig feeds arbitrary stdin to the config parser: it must never panic, and whatever
// it accepts must be internally consistent. Run: go test -run '^$' -fuzz FuzzParseConfig -fuzztime 20s ./cni/plugin/
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"0.3.1","name":"cbr0","type":"aether-cni",`+prev031+`}`), true)
	f.Add([]byte(`{"cniVersion":"1.1.0","excludeOutboundCIDRs":["::/0"],"excludeOutboundPorts":[1,65535],"excludeNamespaces":null}`), false)
	f.Add([]byte(`{"cniVersion":"1.0.0","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"fd00::1/64","gateway":"fd00::"}]}}`), true)
	f.Add([]byte(`{"cniVersion":"1.0.0","prevResult":{}}`), true)
	f.Fuzz(func(t *testing.T, b []byte, needPrev bool) {
		c, err := parseConfig(b, needPrev)
		if err != nil {
			return
		}
		if c.AgentSocket == "" || c.timeout <= 0 {
			t.Fatalf("accepted config without defaults: %+v", c)
		}
		if needPrev && c.prev == nil {
			t.Fatal("accepted a config without prevResult")
		}
		for _, p := range c.capture.ExcludeOutboundPorts {
			if p == 0 {
				t.Fatal("accepted port 0")
			}
		}
	})
}

//go:build linux

package substrate

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// fakePluginName is the name under which the test binary acts as a chained CNI plugin standing
// in for aether-cni: it fails without prevResult (CNI spec 1.1, section "Chained plugins"), logs
// every call to /run/aether/fake-cni.log (which exists only inside the node's mount namespace,
// so the log proves the plugin ran there), marks the pod netns with an nftables table on ADD and
// passes prevResult through.
const fakePluginName = "aether-cni-fake"

// fakeTable is the nftables table the fake plugin creates in each pod netns.
const fakeTable = "aether_fake"

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == fakePluginName {
		os.Exit(fakePlugin())
	}
	if base := os.Getenv(crashChildEnv); base != "" {
		os.Exit(crashChild(base))
	}
	code := m.Run()
	if workloadDir != "" {
		_ = os.RemoveAll(workloadDir)
	}
	os.Exit(code)
}

func fakePlugin() int {
	fail := func(msg string) int {
		_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"cniVersion": CNIVersion, "code": 999, "msg": msg})
		return 1
	}
	cmd := os.Getenv("CNI_COMMAND")
	if cmd == "VERSION" {
		fmt.Printf(`{"cniVersion":%q,"supportedVersions":["1.0.0","1.1.0"]}`+"\n", CNIVersion)
		return 0
	}
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		return fail(err.Error())
	}
	var conf struct {
		CNIVersion string          `json:"cniVersion"`
		PrevResult json.RawMessage `json:"prevResult"`
	}
	if err := json.Unmarshal(in, &conf); err != nil {
		return fail("parse config: " + err.Error())
	}
	f, err := os.OpenFile("/run/aether/fake-cni.log", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fail(err.Error())
	}
	fmt.Fprintf(f, "%s %s %s\n", cmd, os.Getenv("CNI_CONTAINERID"), os.Getenv("CNI_NETNS"))
	f.Close()
	switch cmd {
	case "ADD":
		if len(conf.PrevResult) == 0 {
			return fail("not chained: no prevResult")
		}
		out, err := exec.Command("nsenter", "--net="+os.Getenv("CNI_NETNS"), "--", "nft", "add", "table", "inet", fakeTable).CombinedOutput()
		if err != nil {
			return fail(fmt.Sprintf("mark pod netns: %v: %s", err, out))
		}
		_, _ = os.Stdout.Write(conf.PrevResult)
	case "DEL", "CHECK", "STATUS", "GC":
	default:
		return fail("unknown CNI_COMMAND " + cmd)
	}
	return 0
}

// Command aether-cni is aether's chained CNI plugin (CNI spec 1.1). It runs after the node's
// primary plugin (Flannel), passes its prevResult through unchanged and asks the aether agent,
// over the agent's unix socket, to capture the pod; it fails closed when the agent cannot. The
// logic lives in package cni/plugin (the agent side is package cni); stdout carries only the
// CNI result.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/aethermesh/aether/cni/plugin"
)

func main() {
	// VERSION is answered here, not by skel: the spec wants the input's cniVersion echoed,
	// and skel ignores the input.
	if os.Getenv("CNI_COMMAND") == "VERSION" {
		if err := plugin.ServeVersion(os.Stdin, os.Stdout); err != nil {
			_ = types.NewError(types.ErrIOFailure, err.Error(), "").Print()
			os.Exit(1)
		}
		return
	}
	p := &plugin.Plugin{}
	if err := skel.PluginMainFuncsWithError(p.Funcs(), version.PluginSupports(plugin.SupportedVersions...), "aether-cni: aether service mesh pod capture"); err != nil {
		_ = err.Print()
		os.Exit(1)
	}
}

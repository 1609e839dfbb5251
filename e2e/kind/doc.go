// Package kind holds the scripts that run aether on two real kind clusters (up.sh, run.sh,
// down.sh, e2e.sh, settings in lib.sh; see docs/deploy.md) and their test. The scripts need a
// Docker engine, which the development machines lack: kind_test.go runs them with stand-ins for
// docker, kind, kubectl, curl, openssl and go and checks the commands they issue; hack/test.sh
// runs shellcheck over them.
//
// It owns e2e/kind/ only: the scenarios it runs live in e2e/scenarios, the manifests it
// installs in deploy/, the images it builds in images/.
package kind

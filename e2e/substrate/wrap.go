package substrate

import (
	"fmt"
	"strings"
)

// nsWrap returns the argv that runs argv inside the network namespace at netnsPath (when not
// empty) and in a fresh mount namespace, a slave of the root one, where each bind [source,
// target] is mounted first; hostname, when not empty, is set in a fresh UTS namespace. The
// mounts live only in that namespace and vanish with the process: the root mount namespace never
// changes. The wrapper execs, so the pid is argv's own.
func nsWrap(netnsPath string, binds [][2]string, hostname string, argv []string) []string {
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, b := range binds {
		fmt.Fprintf(&script, "mount --bind %s %s\n", shQuote(b[0]), shQuote(b[1]))
	}
	un := []string{"unshare", "--mount", "--propagation", "slave"}
	if hostname != "" {
		un = append(un, "--uts")
		fmt.Fprintf(&script, "hostname %s\n", shQuote(hostname))
	}
	script.WriteString(`exec "$@"`)
	var out []string
	if netnsPath != "" {
		out = append(out, "nsenter", "--net="+netnsPath, "--")
	}
	out = append(out, un...)
	out = append(out, "--", "/bin/sh", "-c", script.String(), "sh")
	return append(out, argv...)
}

// shQuote quotes s for /bin/sh.
func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

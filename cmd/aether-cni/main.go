// Command aether-cni is not built yet: issue 6 of the project's tracker builds it. Until then it says
// so and exits with status 1, so nothing mistakes it for a working binary.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "aether-cni: not built yet (issue 6)")
	os.Exit(1)
}

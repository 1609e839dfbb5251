// Command aether-agent is not built yet: issue 3 of the project's tracker builds it. Until then it says
// so and exits with status 1, so nothing mistakes it for a working binary.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "aether-agent: not built yet (issue 3)")
	os.Exit(1)
}

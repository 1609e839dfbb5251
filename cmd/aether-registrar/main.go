// Command aether-registrar is not built yet: issue 8 of the project's tracker builds it. Until then it says
// so and exits with status 1, so nothing mistakes it for a working binary.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "aether-registrar: not built yet (issue 8)")
	os.Exit(1)
}

// Command hello is the image the package's tests build: it prints the
// version stamped into it.
package main

import (
	"fmt"

	"github.com/tessera-gpu/tessera/internal/version"
)

func main() { fmt.Println("hello", version.Version) }

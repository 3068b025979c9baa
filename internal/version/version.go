// Package version holds the version stamped into Tessera's binaries at
// build time (`make images` and `make build` pass the repository's VERSION
// file: -ldflags "-X github.com/tessera-gpu/tessera/internal/version.Version=…").
package version

// Version is "dev" in binaries built without the stamp (go run, go test).
var Version = "dev"

// Package examples embeds the demo's example manifests, so the local demo
// (demo/local) and its test apply exactly the files the kind demo applies.
//
// Files are applied in name order; those numbered below 10 set the scene,
// 10 and up are the second act (team-b arrives and reclaims its quota).
package examples

import "embed"

// FS holds the manifests (*.yaml).
//
//go:embed *.yaml
var FS embed.FS

//go:build tools

// Package tools pins helm's command (helm.sh/helm/v3/cmd/helm) in this
// module's go.mod; build.sh builds it.
package tools

import _ "helm.sh/helm/v3/cmd/helm"

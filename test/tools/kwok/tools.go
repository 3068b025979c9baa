//go:build tools

// Package tools pins kwok.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"

//go:build tools

// Package tools pins lws.
package tools

import _ "sigs.k8s.io/lws/cmd"

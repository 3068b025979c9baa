//go:build tools

// Package tools pins kuberay.
package tools

import _ "github.com/ray-project/kuberay/ray-operator"

//go:build tools

// Package tools pins training-operator.
package tools

import _ "github.com/kubeflow/training-operator/cmd/training-operator.v1"

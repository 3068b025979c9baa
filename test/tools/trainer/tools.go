//go:build tools

// Package tools pins trainer.
package tools

import _ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"

//go:build tools

// Package tools pins jobset.
package tools

import _ "sigs.k8s.io/jobset"

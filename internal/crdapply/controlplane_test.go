package crdapply

import (
	"testing"

	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/test/controlplane"
)

func startControlPlane(t *testing.T) *rest.Config {
	return controlplane.Start(t, controlplane.Options{}).AdminConfig
}

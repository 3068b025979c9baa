// Package rbac embeds tessera-controller's RBAC manifests, so tests apply
// exactly the file that is deployed.
package rbac

import _ "embed"

// ControllerYAML is tessera-controller.yaml: its ServiceAccount, ClusterRole
// and ClusterRoleBinding, and the Role and RoleBinding for its leader Lease.
//
//go:embed tessera-controller.yaml
var ControllerYAML []byte

// ShadowYAML is tessera-controller-shadow.yaml: the ServiceAccount,
// read-only ClusterRole and Lease Role of shadow mode (--shadow).
//
//go:embed tessera-controller-shadow.yaml
var ShadowYAML []byte

// Namespace and ServiceAccount the manifests grant to; ShadowServiceAccount
// and ShadowLease are shadow mode's.
const (
	Namespace            = "tessera-system"
	ServiceAccount       = "tessera-controller"
	ShadowServiceAccount = "tessera-shadow"
	ShadowLease          = "tessera-shadow"
)

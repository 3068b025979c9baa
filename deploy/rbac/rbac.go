// Package rbac embeds tessera-controller's RBAC manifests, so tests apply
// exactly the file that is deployed.
package rbac

import _ "embed"

// ControllerYAML is tessera-controller.yaml: its ServiceAccount, ClusterRole
// and ClusterRoleBinding, and the Role and RoleBinding for its leader Lease.
//
//go:embed tessera-controller.yaml
var ControllerYAML []byte

// Namespace and ServiceAccount the manifests grant to.
const (
	Namespace      = "tessera-system"
	ServiceAccount = "tessera-controller"
)

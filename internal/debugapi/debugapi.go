// Package debugapi holds the names tessera-controller's debug server and
// kubectl-tessera agree on: the endpoints' non-resource URLs, the RBAC roles
// that grant them (deploy/rbac), the Leases that name the leader and the
// port. The controller serves (controller/app, debug.go), the plugin asks
// (cmd/kubectl-tessera/ctl) and names the roles in its errors; DESIGN.md,
// Names, is the contract in words.
package debugapi

// DefaultPort is the debug server's port in the chart.
const DefaultPort = 8443

// Endpoint is one endpoint of the debug server with what a caller needs to
// reach it: the URL RBAC grants, the ClusterRole granting it (a 403 names
// it), and, for the plugin's port-forward, the Lease that names the leader
// and the Role that allows reading it and forwarding to the pod.
type Endpoint struct {
	// What the endpoint serves, for messages: "the cycle snapshot".
	What string
	// Path is a non-resource URL: RBAC grants it with nonResourceURLs and
	// verb get.
	Path string
	// ReaderRole is the ClusterRole that grants Path.
	ReaderRole string
	// Lease is the default leader Lease of the controller that serves it.
	Lease string
	// PortForwardRole is the Role, in the controller's namespace, with get
	// on Lease and create on pods/portforward.
	PortForwardRole string
}

// The endpoints' names, as constants for the controller's flags and tests.
const (
	SnapshotPath       = "/debug/tessera/snapshot"
	SnapshotReaderRole = "tessera-snapshot-reader"
	ShadowPath         = "/debug/tessera/shadow"
	ShadowReaderRole   = "tessera-shadow-reader"
)

// Snapshot serves the next cycle's snapshot (any controller, shadow or not).
var Snapshot = Endpoint{
	What:            "the cycle snapshot",
	Path:            SnapshotPath,
	ReaderRole:      SnapshotReaderRole,
	Lease:           "tessera-controller",
	PortForwardRole: "tessera-snapshot-portforward",
}

// Shadow serves shadow mode's report (tessera-controller --shadow only).
var Shadow = Endpoint{
	What:            "the shadow report",
	Path:            ShadowPath,
	ReaderRole:      ShadowReaderRole,
	Lease:           "tessera-shadow",
	PortForwardRole: "tessera-shadow-portforward",
}

// The client CA of the cluster, as aggregated API servers read it: the API
// server publishes the CA that signs client certificates in this ConfigMap,
// readable with the Role ClientCAReaderRole of the same namespace (a
// Kubernetes bootstrap role).
const (
	ClientCANamespace  = "kube-system"
	ClientCAConfigMap  = "extension-apiserver-authentication"
	ClientCAKey        = "client-ca-file"
	ClientCAReaderRole = "extension-apiserver-authentication-reader"
)

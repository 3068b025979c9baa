package app

import (
	"encoding/json"
	"net/http"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/debugapi"
)

// ShadowPath serves shadow mode's report (kube.ShadowReport) as JSON on the
// debug server, to users RBAC lets get it (the ClusterRole
// ShadowReaderRole): the report names pods, nodes and queues, so it is not
// on the unauthenticated metrics address (only the tessera_shadow_*
// metrics are).
const ShadowPath = debugapi.ShadowPath

// ShadowReaderRole is the ClusterRole that grants ShadowPath; a 403 names
// it.
const ShadowReaderRole = debugapi.ShadowReaderRole

// ShadowHandler serves the last shadow report: 503 until the first shadow
// cycle has run (or while this replica does not lead). The debug server
// mounts it behind its authentication and authorisation.
func ShadowHandler(s *kube.Scheduler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			http.Error(w, "GET only", http.StatusMethodNotAllowed)
			return
		}
		rep := s.ShadowReport()
		if rep == nil {
			http.Error(w, "no shadow cycle has run yet (is this replica the leader?)", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	})
}

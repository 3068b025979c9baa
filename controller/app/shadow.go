package app

import (
	"encoding/json"
	"net/http"

	"github.com/tessera-gpu/tessera/controller/kube"
)

// ShadowPath serves shadow mode's report (kube.ShadowReport) as JSON on the
// metrics address.
const ShadowPath = "/shadow"

// ShadowHandler serves the last shadow report: 503 until the first shadow
// cycle has run (or while this replica does not lead). It is a plain
// handler so an authorised debug server can mount it too.
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

package app

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/tessera-gpu/tessera/controller/kube"
)

// AnonymizeQuery asks the snapshot endpoint for an anonymised snapshot
// (kube.AnonymizeSnapshot: what it had to keep heads the file as comments).
const AnonymizeQuery = "anonymize"

// anonymizeAnswer anonymises data when the request asks for it; ok false
// means the error is written. The key is dropped: whoever needs one takes
// the snapshot plain and anonymises it on their side (kubectl tessera
// snapshot --anonymize-key).
func anonymizeAnswer(ctx context.Context, w http.ResponseWriter, r *http.Request, data []byte) ([]byte, bool) {
	v := r.URL.Query().Get(AnonymizeQuery)
	if v == "" {
		return data, true
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		http.Error(w, fmt.Sprintf("?%s=%q: want true or false", AnonymizeQuery, v), http.StatusBadRequest)
		return nil, false
	}
	if !on {
		return data, true
	}
	out, _, err := kube.AnonymizeSnapshot(ctx, data)
	if err != nil {
		http.Error(w, "anonymising the snapshot: "+err.Error(), http.StatusInternalServerError)
		return nil, false
	}
	return out, true
}

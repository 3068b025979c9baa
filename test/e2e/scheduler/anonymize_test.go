package scheduler_test

import (
	"context"
	"fmt"
	"regexp"
	"testing"

	"github.com/tessera-gpu/tessera/controller/kube"
)

// checkAnonymized reads an anonymised snapshot and requires that its replay
// decides what its own decisions (the controller's, renamed) say, that the
// controller's decisions mapped back through key (when there is one) are
// want (when given), and that none of names appears in it as a word.
func checkAnonymized(t *testing.T, data []byte, key *kube.AnonymizeKey, want *kube.Decisions, names ...string) *kube.Dump {
	t.Helper()
	d, err := kube.ParseDump(data)
	if err != nil {
		t.Fatalf("the anonymised snapshot does not parse: %v", err)
	}
	if d.Decisions == nil {
		t.Fatal("the anonymised snapshot holds no decisions")
	}
	got, err := kube.Replay(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", d.Decisions) {
		t.Fatalf("the anonymised snapshot replays differently from the controller's decisions renamed:\ncontroller: %+v\nreplay:     %+v", d.Decisions, got)
	}
	if key != nil && want != nil {
		if back := key.RestoreDecisions(got); fmt.Sprintf("%+v", back) != fmt.Sprintf("%+v", want) {
			t.Fatalf("the anonymised replay, mapped back through the key, differs from the controller:\ncontroller: %+v\nmapped back: %+v", want, back)
		}
	}
	for _, n := range names {
		// A word: not inside a longer name or a UID's hex.
		re := regexp.MustCompile(`(^|[^A-Za-z0-9._-])` + regexp.QuoteMeta(n) + `($|[^A-Za-z0-9_-])`)
		if loc := re.FindIndex(data); loc != nil {
			lo, hi := max(0, loc[0]-80), min(len(data), loc[1]+80)
			t.Errorf("original name %q is in the anonymised snapshot: ...%s...", n, data[lo:hi])
		}
	}
	t.Logf("anonymised snapshot: %d bytes, replay agrees (%d binds, %d evictions, %d pending)", len(data), len(got.Binds), len(got.Evictions), len(got.Pending))
	return d
}

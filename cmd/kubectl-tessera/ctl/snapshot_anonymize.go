package ctl

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/tessera-gpu/tessera/controller/kube"
)

// query asks the controller to anonymise unless the plugin does it here
// (to write the key, which never leaves the user's machine).
func (o *snapshotOptions) anonymizeQuery() string {
	if o.anonymize && o.anonymizeKey == "" {
		return "anonymize=true"
	}
	return ""
}

// anonymizeHere anonymises the snapshot on the user's side when a key file
// is asked for, checks the result replays the same, and writes the key
// (mode 0600); warnings go to out (standard error when the snapshot goes
// to standard output).
func (o *snapshotOptions) anonymizeHere(ctx context.Context, data []byte, out io.Writer) ([]byte, error) {
	if o.anonymizeKey == "" {
		return data, nil
	}
	anon, an, err := kube.AnonymizeSnapshot(ctx, data)
	if err != nil {
		return nil, err
	}
	key, err := kube.MarshalAnonymizeKey(an.Key)
	if err == nil {
		err = os.WriteFile(o.anonymizeKey, key, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("writing the anonymize key: %w", err)
	}
	w := out
	if o.output == "-" {
		w = os.Stderr
	}
	for _, warning := range an.Warnings {
		fmt.Fprintf(w, "Warning: %s\n", warning)
	}
	fmt.Fprintf(w, "Wrote the anonymize key to %s (%d names): keep it apart from the snapshot\n", o.anonymizeKey, len(an.Key.Segments))
	return anon, nil
}

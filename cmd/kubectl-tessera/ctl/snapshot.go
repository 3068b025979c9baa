package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/debugapi"
)

// snapshotOptions are the snapshot command's flags.
type snapshotOptions struct {
	output string
	debugFlags
	// anonymize asks for renamed names (the controller renames; with
	// anonymizeKey the plugin does, to write the key).
	anonymize    bool
	anonymizeKey string
}

func parseSnapshotFlags(args []string) (*snapshotOptions, error) {
	o := &snapshotOptions{}
	fs := flag.NewFlagSet("snapshot", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.output, "o", "-", "file to write the snapshot to (- for standard output)")
	fs.StringVar(&o.output, "output", "-", "file to write the snapshot to")
	o.register(fs, debugapi.Snapshot)
	fs.BoolVar(&o.anonymize, "anonymize", false, "rename every user-chosen name, consistently and in order")
	fs.StringVar(&o.anonymizeKey, "anonymize-key", "", "with --anonymize: also write the key (original -> new names) to this file")
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("snapshot takes no arguments, got %q", fs.Args())
	}
	if err := o.check("snapshot"); err != nil {
		return nil, err
	}
	if o.anonymizeKey != "" && !o.anonymize {
		return nil, errors.New("snapshot --anonymize-key needs --anonymize")
	}
	if o.anonymizeKey != "" && o.anonymizeKey == o.output {
		return nil, errors.New("snapshot --anonymize-key must not be the snapshot's file: the key undoes the renaming")
	}
	o.query = o.anonymizeQuery()
	return o, nil
}

// snapshot fetches the next cycle's snapshot from tessera-controller's
// debug server with the user's own credentials (debugserver.go), checks it
// parses, and writes it.
func snapshot(ctx context.Context, c Clients, args []string, out io.Writer) error {
	o, err := parseSnapshotFlags(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	data, err := getDebug(ctx, c, &o.debugFlags, debugapi.Snapshot)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if _, err := kube.ParseDump(data); err != nil {
		return fmt.Errorf("the controller's answer is not a cycle snapshot: %w", err)
	}
	if data, err = o.anonymizeHere(ctx, data, out); err != nil {
		return err
	}
	if o.output == "-" {
		_, err = out.Write(data)
		return err
	}
	if err := os.WriteFile(o.output, data, 0o600); err != nil {
		return fmt.Errorf("writing the snapshot: %w", err)
	}
	fmt.Fprintf(out, "Wrote the cycle snapshot to %s (%d bytes)\n", o.output, len(data))
	return nil
}

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/tessera-gpu/tessera/controller/kube"
)

func init() {
	register("anonymize", "rename a cycle snapshot's names, keeping its decisions", func(args []string) int {
		return anonymizeCmd(args, os.Stdout, os.Stderr)
	})
}

const anonymizeHelp = `usage: tessera-sim anonymize FILE -o OUT [--key KEY]

Renames every user-chosen name of a cycle snapshot (namespaces, pods, nodes,
queues, PodGroups, claims, user label values, selectors and CEL strings that
are names, the carried state and the decisions) consistently and in order,
so that the anonymised file replays to the same decisions. It checks that:
both files are replayed and the anonymised one's decisions, mapped back,
must equal the original's. docs/DESIGN.md says what is renamed and what kept.

  -o     the anonymised snapshot
  --key  also write the key (original -> new name segments) to KEY, mode
         0600; keep it to yourself: it undoes the renaming
         (tessera-sim replay OUT --key KEY prints the original names)

exit 0: written · 1: the anonymised snapshot would replay differently
(nothing written) · 2: bad file or flag
`

func anonymizeCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("anonymize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, anonymizeHelp) }
	out := fs.String("o", "", "the anonymised snapshot")
	keyFile := fs.String("key", "", "write the key here")
	file, rest := splitFile(args)
	if err := fs.Parse(rest); err != nil {
		return 2
	}
	if file == "" || *out == "" || fs.NArg() > 0 {
		fmt.Fprint(stderr, anonymizeHelp)
		return 2
	}
	fail := func(code int, err error) int {
		fmt.Fprintf(stderr, "tessera-sim anonymize: %s: %v\n", file, err)
		return code
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return fail(2, err)
	}
	if _, err := kube.ParseDump(data); err != nil {
		return fail(2, err)
	}
	b, an, err := kube.AnonymizeSnapshot(context.Background(), data)
	if err != nil {
		return fail(1, err)
	}
	if *keyFile != "" {
		kb, err := kube.MarshalAnonymizeKey(an.Key)
		if err == nil {
			err = os.WriteFile(*keyFile, kb, 0o600)
		}
		if err != nil {
			return fail(2, fmt.Errorf("writing the key: %w", err))
		}
	}
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		return fail(2, err)
	}
	for _, w := range an.Warnings {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	fmt.Fprintf(stdout, "wrote %s: %d name segments renamed; its replay decides the same as the original's\n",
		*out, len(an.Key.Segments))
	if *keyFile != "" {
		fmt.Fprintf(stdout, "wrote the key to %s: keep it apart from the snapshot\n", *keyFile)
	}
	return 0
}

// readKey reads an anonymize key file (replay --key).
func readKey(path string) (*kube.AnonymizeKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return kube.ParseAnonymizeKey(data)
}

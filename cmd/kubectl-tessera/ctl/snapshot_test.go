package ctl

import (
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/internal/debugapi"
)

// TestParseSnapshotFlags: bad flags are refused with an error that says
// what is wrong; a direct address must say how to trust the server.
func TestParseSnapshotFlags(t *testing.T) {
	lease, port := debugapi.Snapshot.Lease, debugapi.DefaultPort
	for _, tc := range []struct {
		args    []string
		wantErr string
		want    snapshotOptions
	}{
		{args: nil, want: snapshotOptions{output: "-", debugFlags: debugFlags{namespace: DefaultControllerNamespace, lease: lease, port: port}}},
		{args: []string{"-o", "c.yaml", "--controller-namespace", "tsr", "--port", "9443"},
			want: snapshotOptions{output: "c.yaml", debugFlags: debugFlags{namespace: "tsr", lease: lease, port: 9443}}},
		{args: []string{"--address", "10.0.0.5:8443", "--insecure-skip-tls-verify"},
			want: snapshotOptions{output: "-", debugFlags: debugFlags{address: "10.0.0.5:8443", namespace: DefaultControllerNamespace, lease: lease, port: port, insecure: true}}},
		{args: []string{"--address", "10.0.0.5:8443"}, wantErr: "--certificate-authority or --insecure-skip-tls-verify"},
		{args: []string{"extra"}, wantErr: `snapshot takes no arguments, got ["extra"]`},
		{args: []string{"--frobnicate"}, wantErr: "flag provided but not defined: -frobnicate"},
		{args: []string{"--port", "x"}, wantErr: `invalid value "x" for flag -port`},
		{args: []string{"--anonymize", "-o", "c.yaml"},
			want: snapshotOptions{output: "c.yaml", debugFlags: debugFlags{namespace: DefaultControllerNamespace, lease: lease, port: port, query: "anonymize=true"}, anonymize: true}},
		{args: []string{"--anonymize", "--anonymize-key", "k.yaml", "-o", "c.yaml"},
			want: snapshotOptions{output: "c.yaml", debugFlags: debugFlags{namespace: DefaultControllerNamespace, lease: lease, port: port}, anonymize: true, anonymizeKey: "k.yaml"}},
		{args: []string{"--anonymize-key", "k.yaml"}, wantErr: "--anonymize-key needs --anonymize"},
		{args: []string{"--anonymize", "--anonymize-key", "c.yaml", "-o", "c.yaml"}, wantErr: "must not be the snapshot's file"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			got, err := parseSnapshotFlags(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("want an error containing %q, got %v", tc.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *got != tc.want {
				t.Fatalf("got %+v, want %+v", *got, tc.want)
			}
		})
	}
}

package ctl

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

func TestMilliGPUs(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 1000: "1", 1500: "1.5", 250: "0.25", 8001: "8.001"} {
		if got := milliGPUs(in); got != want {
			t.Errorf("milliGPUs(%d) = %q, want %q", in, got, want)
		}
	}
}

// TestShadowErrors: bad flags, a controller that has no report yet (503),
// a refusal and a body that is no report are errors that say what is
// wrong. The server stands in for the debug server (TLS, one path).
func TestShadowErrors(t *testing.T) {
	answer := func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no shadow cycle has run yet", http.StatusServiceUnavailable)
	}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/tessera/shadow" {
			http.NotFound(w, r)
			return
		}
		answer(w, r)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "https://")
	c := Clients{RestConfig: &rest.Config{Host: "https://unused.invalid", BearerToken: "t"}}
	direct := []string{"shadow", "--address", addr, "--insecure-skip-tls-verify"}
	for _, tc := range []struct {
		name   string
		args   []string
		answer http.HandlerFunc
		want   string
	}{
		{"bad -o", append(direct, "-o", "yaml"), nil, `-o "yaml"`},
		{"no way to trust", []string{"shadow", "--address", addr}, nil, "--certificate-authority or --insecure-skip-tls-verify"},
		{"an argument", append(direct, "x"), nil, `shadow takes no arguments, got ["x"]`},
		{"no report yet", direct, nil, "503 Service Unavailable for the shadow report: no shadow cycle has run yet"},
		{"forbidden", direct, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusForbidden) },
			"bind the ClusterRole tessera-shadow-reader to your user"},
		{"not a report", direct, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("<html>")) }, "reading the shadow report"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answer = func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "no shadow cycle has run yet", http.StatusServiceUnavailable)
			}
			if tc.answer != nil {
				answer = tc.answer
			}
			err := Run(context.Background(), c, tc.args, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestParseShadowFlags: shadow finds the shadow controller's leader by its
// own Lease, not the scheduling controller's.
func TestParseShadowFlags(t *testing.T) {
	o, err := parseShadowFlags([]string{"-o", "json", "--controller-namespace", "tsr"})
	if err != nil {
		t.Fatal(err)
	}
	want := shadowOptions{output: "json", debugFlags: debugFlags{namespace: "tsr", lease: "tessera-shadow", port: 8443}}
	if *o != want {
		t.Fatalf("got %+v, want %+v", *o, want)
	}
}

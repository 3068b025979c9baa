package ctl

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestMilliGPUs(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 1000: "1", 1500: "1.5", 250: "0.25", 8001: "8.001"} {
		if got := milliGPUs(in); got != want {
			t.Errorf("milliGPUs(%d) = %q, want %q", in, got, want)
		}
	}
}

// TestShadowErrors: a bad -o, a controller not in shadow mode (503) and a
// body that is no report are errors that say what is wrong.
func TestShadowErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/garbage" {
			_, _ = w.Write([]byte("<html>"))
			return
		}
		http.Error(w, "no shadow cycle has run yet", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	for _, tc := range []struct {
		opts ShadowOptions
		want string
	}{
		{ShadowOptions{URL: srv.URL + "/shadow", Output: "yaml"}, `-o "yaml"`},
		{ShadowOptions{URL: srv.URL + "/shadow"}, "503 Service Unavailable: no shadow cycle has run yet"},
		{ShadowOptions{URL: srv.URL + "/garbage"}, "reading the shadow report"},
	} {
		err := Run(context.Background(), Clients{Shadow: tc.opts}, []string{"shadow"}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error with %q", tc.opts, err, tc.want)
		}
	}
}

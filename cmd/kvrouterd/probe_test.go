package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestProbe: `kvrouterd probe` exits 0 only when every URL answers 200, and otherwise says which
// URL failed and why (the /readyz reason included), so that a container engine's health check
// log tells the operator what to look at.
func TestProbe(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.Write([]byte("ok\n"))
		case "/readyz":
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("catching up: event stream applied to sequence 3 of 9\n"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()

	f := func(args []string, wantCode int, wantErr string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := probeMain(args, &out, &errOut)
		if code != wantCode {
			t.Errorf("probe %q: exit %d, want %d; stderr %q", args, code, wantCode, errOut.String())
		}
		if !strings.Contains(errOut.String(), wantErr) {
			t.Errorf("probe %q: stderr %q, want it to contain %q", args, errOut.String(), wantErr)
		}
		if wantCode == 0 && args[0] != "--help" && strings.Count(out.String(), ": ok\n") != len(args) {
			t.Errorf("probe %q: stdout %q, want a line per URL", args, out.String())
		}
	}
	f([]string{srv.URL + "/healthz"}, 0, "")
	f([]string{srv.URL + "/healthz", srv.URL + "/healthz"}, 0, "")
	f([]string{srv.URL + "/readyz"}, 1, "503 Service Unavailable: catching up: event stream applied to sequence 3 of 9")
	f([]string{srv.URL + "/healthz", srv.URL + "/readyz"}, 1, srv.URL+"/readyz: 503")
	f([]string{srv.URL + "/nowhere"}, 1, "404")
	f([]string{closed.URL + "/healthz"}, 1, closed.URL+"/healthz: ")
	f([]string{"127.0.0.1:8090/healthz"}, 1, "want an http:// or https:// URL")
	f(nil, 2, "name at least one URL")
	f([]string{"--timeout", "soon", srv.URL}, 2, "invalid value")
	f([]string{"--help"}, 0, "Usage: kvrouterd probe")
}

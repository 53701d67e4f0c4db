package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/daemon"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
)

// dynSetting is one line of testdata/dynamo_flags.txt: one of Dynamo's settings, how it is
// given, and, if kvrouterd honours it, the daemon.Config field it sets.
type dynSetting struct {
	line                    int
	kind, flag, env, sample string
	field                   string   // "": accepted without effect
	want                    []string // after the flag (a bool: then after its --no- form)
}

// readDynamoSettings reads testdata/dynamo_flags.txt, with $CERT and $KEY replaced.
func readDynamoSettings(t *testing.T, cert, key string) []dynSetting {
	t.Helper()
	f, err := os.Open("testdata/dynamo_flags.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []dynSetting
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		text := strings.NewReplacer("$CERT", cert, "$KEY", key).Replace(sc.Text())
		if strings.TrimSpace(text) == "" || strings.HasPrefix(text, "#") {
			continue
		}
		left, right, mapped := strings.Cut(text, "=>")
		fs := strings.Fields(left)
		if len(fs) != 4 {
			t.Fatalf("dynamo_flags.txt:%d: want KIND FLAG VARIABLE SAMPLE, got %q", n, left)
		}
		s := dynSetting{line: n, kind: fs[0], flag: fs[1], env: fs[2], sample: fs[3]}
		switch s.kind {
		case "value", "bool", "switch", "env":
		default:
			t.Fatalf("dynamo_flags.txt:%d: unknown kind %q", n, s.kind)
		}
		if mapped {
			rs := strings.Fields(right)
			if len(rs) < 2 {
				t.Fatalf("dynamo_flags.txt:%d: want => FIELD WANT", n)
			}
			s.field = rs[0]
			if s.kind == "bool" {
				if len(rs) != 3 {
					t.Fatalf("dynamo_flags.txt:%d: a bool wants two values", n)
				}
				s.want = rs[1:]
			} else {
				s.want = []string{strings.Join(rs[1:], " ")}
			}
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) < 100 {
		t.Fatalf("dynamo_flags.txt: %d settings, expected Dynamo's whole list", len(out))
	}
	return out
}

// configField prints c's field at path (a.b for nested fields) as the fixture writes it.
func configField(t *testing.T, c daemon.Config, path string) string {
	t.Helper()
	v := reflect.ValueOf(c)
	for _, name := range strings.Split(path, ".") {
		v = v.FieldByName(name)
		if !v.IsValid() {
			t.Fatalf("daemon.Config has no field %s", path)
		}
	}
	return fmt.Sprint(v.Interface())
}

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// forms are the ways s is given on a command line, each with the index of its want.
func (s dynSetting) forms() [][]string {
	switch {
	case s.flag == "-":
		return nil
	case s.kind == "value":
		return [][]string{{s.flag, s.sample}}
	case s.kind == "bool":
		return [][]string{{s.flag}, {"--no-" + strings.TrimPrefix(s.flag, "--")}}
	}
	return [][]string{{s.flag}}
}

// envForms are the variable settings that give s, as its forms do.
func (s dynSetting) envForms() []map[string]string {
	switch {
	case s.env == "-":
		return nil
	case s.kind == "bool":
		return []map[string]string{{s.env: "true"}, {s.env: "false"}}
	case s.kind == "switch":
		return []map[string]string{{s.env: "true"}}
	}
	return []map[string]string{{s.env: s.sample}}
}

// TestDynamoFlagsEach gives kvrouterd each of Dynamo's settings alone, as a flag (each form)
// and as a variable: every one is accepted; one kvrouterd honours sets its field; any other
// leaves exactly one warning that names it.
func TestDynamoFlagsEach(t *testing.T) {
	pki := newTestPKI(t)
	settings := readDynamoSettings(t, pki.serverCert, pki.serverKey)
	check := func(s dynSetting, how string, i int, c daemon.Config, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("dynamo_flags.txt:%d %s: refused: %v", s.line, how, err)
			return
		}
		if s.field != "" {
			if got := configField(t, c, s.field); got != s.want[i] {
				t.Errorf("dynamo_flags.txt:%d %s: %s is %s, want %s", s.line, how, s.field, got, s.want[i])
			}
			if len(c.DynamoIgnored) != 0 {
				t.Errorf("dynamo_flags.txt:%d %s: honoured, yet warned of: %+v", s.line, how, c.DynamoIgnored)
			}
			return
		}
		if len(c.DynamoIgnored) != 1 {
			t.Errorf("dynamo_flags.txt:%d %s: %d warnings, want one: %+v", s.line, how, len(c.DynamoIgnored), c.DynamoIgnored)
			return
		}
		w := c.DynamoIgnored[0]
		name := s.flag
		if name == "-" {
			name = w.Name // a variable alone: the flag it is read for
		}
		if !strings.Contains(w.Name, name) || w.Reason == "" {
			t.Errorf("dynamo_flags.txt:%d %s: warning %+v does not name %s with a reason", s.line, how, w, name)
		}
	}
	for _, s := range settings {
		for i, args := range s.forms() {
			c, err := parseUnchecked(args, envOf(nil), io.Discard)
			check(s, strings.Join(args, " "), i, c, err)
		}
		for i, env := range s.envForms() {
			c, err := parseUnchecked(nil, envOf(env), io.Discard)
			check(s, fmt.Sprint(env), i, c, err)
		}
	}
	// Dynamo's nullable flags take None: unset.
	c, err := parseConfig([]string{"--active-decode-blocks-threshold", "None", "--active-prefill-tokens-threshold", "None",
		"--active-prefill-tokens-threshold-frac", "None", "--router-queue-threshold", "None"}, envOf(nil), io.Discard)
	if err != nil || c.ActiveDecodeBlocksThreshold.On || c.ActivePrefillTokensThreshold.On || c.ActivePrefillTokensThresholdFrac.On || c.RouterQueueThreshold.On {
		t.Fatalf("None: %v", err)
	}
	// --no-admission-control clears thresholds given before it, as Dynamo's did.
	c, err = parseConfig([]string{"--active-decode-blocks-threshold", "0.9", "--active-prefill-tokens-threshold", "10",
		"--active-prefill-tokens-threshold-frac", "2", "--no-admission-control"}, envOf(nil), io.Discard)
	if err != nil || c.ActiveDecodeBlocksThreshold.On || c.ActivePrefillTokensThreshold.On || c.ActivePrefillTokensThresholdFrac.On {
		t.Fatalf("--no-admission-control: %+v %+v %+v %v", c.ActiveDecodeBlocksThreshold, c.ActivePrefillTokensThreshold,
			c.ActivePrefillTokensThresholdFrac, err)
	}
}

// dynamoCommandLine is every setting of the fixture at once: the flags (booleans in their
// first form) and the variables, and the names of the flags kvrouterd warns of.
func dynamoCommandLine(settings []dynSetting) (args []string, env map[string]string, ignored []string) {
	env = map[string]string{}
	for _, s := range settings {
		if f := s.forms(); len(f) > 0 {
			args = append(args, f[0]...)
			if s.field == "" {
				ignored = append(ignored, s.flag)
			}
		}
		if e := s.envForms(); len(e) > 0 {
			for k, v := range e[0] {
				env[k] = v
			}
		}
	}
	return args, env, ignored
}

// TestDynamoFlagsTogether: a command line with every Dynamo flag, the environment with every
// Dynamo variable, and both at once pass kvrouterd's whole check; so do the --no- forms.
func TestDynamoFlagsTogether(t *testing.T) {
	pki := newTestPKI(t)
	settings := readDynamoSettings(t, pki.serverCert, pki.serverKey)
	args, env, ignored := dynamoCommandLine(settings)
	var negated []string
	for _, s := range settings {
		if f := s.forms(); len(f) == 2 {
			negated = append(negated, f[1]...)
		}
	}
	for _, run := range []struct {
		name string
		args []string
		env  map[string]string
	}{{"flags", args, nil}, {"variables", nil, env}, {"both", args, env}, {"--no- forms", negated, nil}} {
		c, err := parseConfig(run.args, envOf(run.env), io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", run.name, err)
		}
		if run.name == "flags" || run.name == "both" {
			if len(c.DynamoIgnored) != len(ignored) {
				t.Errorf("%s: %d warnings for %d ignored flags", run.name, len(c.DynamoIgnored), len(ignored))
			}
			for _, s := range settings {
				if s.field != "" && s.kind != "bool" && s.flag != "-" && s.flag != "--no-admission-control" &&
					!strings.HasPrefix(s.field, "Active") && !strings.HasPrefix(s.field, "EnforceDisagg") {
					if got := configField(t, c, s.field); got != s.want[0] {
						t.Errorf("%s: %s: %s is %s, want %s", run.name, s.flag, s.field, got, s.want[0])
					}
				}
			}
		}
	}
}

// TestDaemonDynamoCommandLine starts the daemon's binary with every Dynamo flag and variable:
// it starts and serves (HTTPS, from Dynamo's certificate flags), logs exactly one warning for
// each flag it accepts without effect, and serves the test endpoints Dynamo's switch mounts.
func TestDaemonDynamoCommandLine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildDaemon(t)
	pki := newTestPKI(t)
	settings := readDynamoSettings(t, pki.serverCert, pki.serverKey)
	args, env, ignored := dynamoCommandLine(settings)
	addr := freeport.TB(t)
	args = append([]string{"--http-addr", addr, "--data-dir", t.TempDir(), "--nats-listen", freeport.TB(t)}, args...)
	cmd := exec.Command(bin, args...)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var logs lockedBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(pki.ca)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(ca)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get("https://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			t.Fatalf("the daemon did not start with Dynamo's command line (last: %v):\n%s", err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	log := logs.String()
	for _, name := range ignored {
		if name == "-i" {
			name = "-i (--interactive)"
		}
		if n := strings.Count(log, name+": Dynamo's setting is accepted and has no effect"); n != 1 {
			t.Errorf("%s: %d warnings, want 1", name, n)
		}
	}
	// DYN_KV_INDEXER_TEST_ENDPOINTS mounted Dynamo's test endpoints.
	resp, err := hc.Post("https://"+addr+"/test/pause_listener", "application/json", strings.NewReader(`{"instance_id": 9}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "instance 9 not found") {
		t.Fatalf("/test/pause_listener: %d %s", resp.StatusCode, body)
	}
	if t.Failed() {
		t.Logf("logs:\n%s", log)
	}
}

// lockedBuffer is a bytes.Buffer a process writes while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

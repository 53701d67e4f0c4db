package deploy

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction: its keyword in upper case, its arguments, and the
// build stage it belongs to.
type instruction struct {
	cmd, args string
	stage     int
}

// parseDockerfile splits a Dockerfile into instructions, continuation lines joined and comments
// dropped, and numbers the stages from 0; ${ARG}s given before the first FROM are substituted
// in the FROM lines, as the builder does.
func parseDockerfile(t *testing.T, text string) []instruction {
	t.Helper()
	var (
		ins     []instruction
		pending string
		stage   = -1
		globals = map[string]string{}
	)
	for line := range strings.SplitSeq(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if pending == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if pending != "" && strings.HasPrefix(trimmed, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, `\`); ok {
			pending += s + " "
			continue
		}
		full := pending + trimmed
		pending = ""
		cmd, args, _ := strings.Cut(full, " ")
		cmd, args = strings.ToUpper(cmd), strings.TrimSpace(args)
		switch {
		case cmd == "FROM":
			stage++
			for k, v := range globals {
				args = strings.ReplaceAll(args, "${"+k+"}", v)
			}
		case cmd == "ARG" && stage < 0:
			if k, v, ok := strings.Cut(args, "="); ok {
				globals[k] = v
			}
		}
		ins = append(ins, instruction{cmd, args, stage})
	}
	if pending != "" {
		t.Fatalf("the Dockerfile ends in a continuation: %q", pending)
	}
	return ins
}

// execForm decodes an instruction's JSON (exec) form; the shell form needs a shell the image
// does not have.
func execForm(t *testing.T, in instruction, args string) []string {
	t.Helper()
	var v []string
	if err := json.Unmarshal([]byte(args), &v); err != nil || len(v) == 0 {
		t.Fatalf("%s %s: want the exec form [\"...\"], which needs no shell in the image (%v)", in.cmd, args, err)
	}
	return v
}

// TestDockerfile reads deploy/Dockerfile as the builder would and checks the image it
// describes: built by deploy/build.sh on the Go that go.mod names, onto a minimal base without a
// shell, running as a user other than root, the data directory a volume that user owns, the
// daemon's default ports exposed, every flag it passes a flag of the daemon, and a health
// check that — run as written against a daemon started here — passes.
func TestDockerfile(t *testing.T) {
	text, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	ins := parseDockerfile(t, string(text))
	last := ins[len(ins)-1].stage
	if last < 1 {
		t.Fatalf("%d build stages: want a build stage and a minimal final one", last+1)
	}
	final := func(cmd string) []instruction {
		var out []instruction
		for _, in := range ins {
			if in.stage == last && in.cmd == cmd {
				out = append(out, in)
			}
		}
		return out
	}
	one := func(cmd string) instruction {
		t.Helper()
		in := final(cmd)
		if len(in) != 1 {
			t.Fatalf("the final stage has %d %s instructions, want one", len(in), cmd)
		}
		return in[0]
	}

	// The build: build.sh, on go.mod's Go, its output copied into the final stage and run.
	goMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(goMod)
	if goLine == nil {
		t.Fatal("go.mod has no go line")
	}
	buildRun := regexp.MustCompile(`\bdeploy/build\.sh\s+(\S+)`)
	var built, buildStage string
	for _, in := range ins {
		if in.cmd == "FROM" && in.stage < last {
			image, alias, _ := strings.Cut(in.args, " AS ")
			for strings.HasPrefix(image, "--") { // --platform=…
				_, image, _ = strings.Cut(image, " ")
			}
			if want := "golang:" + string(goLine[1]); image != want && !strings.HasPrefix(image, want+"-") && !strings.HasPrefix(image, want+".") {
				t.Errorf("build stage FROM %s: want %s, the Go of go.mod", image, want)
			}
			buildStage = strings.TrimSpace(alias)
		}
		if m := buildRun.FindStringSubmatch(in.args); in.cmd == "RUN" && in.stage < last && m != nil {
			built = m[1]
		}
	}
	if built == "" {
		t.Fatal("no build stage RUNs deploy/build.sh OUT: the image would be built otherwise than the tests build it")
	}
	from := one("FROM").args
	if !strings.HasPrefix(from, "gcr.io/distroless/static") && from != "scratch" {
		t.Errorf("final stage FROM %s: want a minimal image without a shell (distroless/static or scratch)", from)
	}
	var binary string
	for _, in := range final("COPY") {
		f := strings.Fields(in.args)
		if slices.Contains(f, "--from="+buildStage) && f[len(f)-2] == built {
			binary = f[len(f)-1]
		}
	}
	if binary == "" {
		t.Fatalf("the final stage copies no %s from stage %s", built, buildStage)
	}
	entry := execForm(t, one("ENTRYPOINT"), one("ENTRYPOINT").args)
	if len(entry) != 1 || entry[0] != binary {
		t.Errorf("ENTRYPOINT %q: want [%q], the binary build.sh made", entry, binary)
	}

	// The flags of CMD, each a flag of the daemon.
	flags := daemonFlags(t)
	cmd := execForm(t, one("CMD"), one("CMD").args)
	args := map[string]string{}
	for i := 0; i < len(cmd); i++ {
		name, ok := strings.CutPrefix(cmd[i], "--")
		if !ok {
			t.Fatalf("CMD %q: %q is no flag", cmd, cmd[i])
		}
		name, value, hasValue := strings.Cut(name, "=")
		if _, ok := flags[name]; !ok {
			t.Errorf("CMD passes --%s, which kvrouterd --help does not list", name)
		}
		if !hasValue && i+1 < len(cmd) && !strings.HasPrefix(cmd[i+1], "--") {
			i++
			value = cmd[i]
		}
		args[name] = value
	}
	setting := func(name string) string {
		if v, ok := args[name]; ok {
			return v
		}
		return flags[name].def
	}

	// Non-root, and the data directory a volume it owns.
	user := strings.Fields(one("USER").args)[0]
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); uid == "root" || err == nil && n == 0 || err != nil {
		t.Errorf("USER %s: want a numeric user other than root (0), so that runAsNonRoot can check it", user)
	}
	dataDir := setting("data-dir")
	if !slices.Contains(strings.Fields(one("VOLUME").args), dataDir) {
		t.Errorf("VOLUME %s: want --data-dir %s, where snapshots and the embedded stream live", one("VOLUME").args, dataDir)
	}
	owned := false
	for _, in := range final("COPY") {
		f := strings.Fields(in.args)
		owned = owned || f[len(f)-1] == dataDir && slices.Contains(f, "--chown="+user)
	}
	if !owned {
		t.Errorf("no COPY --chown=%s creates %s: a volume mounted there would be root's, unwritable to the daemon", user, dataDir)
	}

	// The ports: the HTTP API's alone. The embedded NATS server stays on loopback, as the
	// daemon's default has it (docs/security.md): opening it is the operator's choice.
	port := func(name string) string {
		t.Helper()
		_, p, err := net.SplitHostPort(setting(name))
		if err != nil {
			t.Fatalf("--%s %q: %v", name, setting(name), err)
		}
		return p
	}
	httpPort := port("http-addr")
	if host, _, _ := net.SplitHostPort(setting("nats-listen")); host != "127.0.0.1" && host != "localhost" {
		t.Errorf("--nats-listen %s: the image opens the embedded NATS server past loopback by default", setting("nats-listen"))
	}
	if exposed := strings.Fields(one("EXPOSE").args); !slices.Equal(exposed, []string{httpPort}) {
		t.Errorf("EXPOSE %q: want the HTTP port %s alone", exposed, httpPort)
	}

	// The health check: the binary's probe of /healthz and /readyz on the HTTP port. Run as
	// written, with the port of a daemon started here, it passes.
	hc := one("HEALTHCHECK").args
	i := strings.Index(hc, "CMD ")
	if i < 0 {
		t.Fatalf("HEALTHCHECK %s: no CMD", hc)
	}
	probe := execForm(t, one("HEALTHCHECK"), hc[i+4:])
	if len(probe) < 4 || probe[0] != binary || probe[1] != "probe" {
		t.Fatalf("HEALTHCHECK CMD %q: want %s probe URL...", probe, binary)
	}
	var paths []string
	addr := startDaemon(t)
	bin, _ := buildImageBinary(t)
	for j, a := range probe[2:] {
		if rest, ok := strings.CutPrefix(a, "http://127.0.0.1:"+httpPort); ok {
			paths = append(paths, rest)
			probe[2+j] = "http://" + addr + rest
		}
	}
	if !slices.Equal(paths, []string{"/healthz", "/readyz"}) {
		t.Errorf("HEALTHCHECK probes %q on 127.0.0.1:%s: want /healthz and /readyz", paths, httpPort)
	}
	if out, err := exec.Command(bin, probe[1:]...).CombinedOutput(); err != nil {
		t.Errorf("the health check %q against a ready daemon: %v\n%s", probe, err, out)
	}
}

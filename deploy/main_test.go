package deploy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/daemon"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
)

// root is the repository's root, where the Dockerfile's build context starts.
var root = func() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return filepath.Dir(wd)
}()

// built is the binary deploy/build.sh made, once per test process, in a directory TestMain
// removes afterwards.
var built struct {
	once     sync.Once
	dir, bin string
	version  string
	out      []byte
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// buildImageBinary runs deploy/build.sh as the Dockerfile does, with the Go running the
// tests, and returns the binary and the version it was told to stamp in.
func buildImageBinary(t *testing.T) (bin, version string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the daemon")
	}
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "kvrouterd-deploy-")
		if built.err != nil {
			return
		}
		built.version = fmt.Sprintf("deploy-test-%d", os.Getpid())
		bin := filepath.Join(built.dir, "kvrouterd")
		cmd := exec.Command("sh", filepath.Join(root, "deploy", "build.sh"), bin)
		cmd.Env = append(os.Environ(), "VERSION="+built.version, "GO="+filepath.Join(runtime.GOROOT(), "bin", "go"))
		if built.out, built.err = cmd.CombinedOutput(); built.err != nil {
			built.err = fmt.Errorf("deploy/build.sh: %v\n%s", built.err, built.out)
			return
		}
		built.bin = bin
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin, built.version
}

// flagInfo is a flag as the binary's --help lists it.
type flagInfo struct {
	def string // its default, as --help quotes it
	env bool   // it has a KVR_ variable
}

var helpFlag = regexp.MustCompile(`^  --([a-z0-9-]+) \(([^)]*)\)`)

// daemonFlags parses the flags out of the built binary's --help: the real parser's flags,
// defaults and variables, and nothing a test could hold apart from them.
func daemonFlags(t *testing.T) map[string]flagInfo {
	t.Helper()
	bin, _ := buildImageBinary(t)
	var out bytes.Buffer
	cmd := exec.Command(bin, "--help")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("kvrouterd --help: %v\n%s", err, out.String())
	}
	flags := map[string]flagInfo{}
	for line := range strings.SplitSeq(out.String(), "\n") {
		m := helpFlag.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var fi flagInfo
		if _, def, ok := strings.Cut(m[2], `default "`); ok {
			fi.def = strings.TrimSuffix(def, `"`)
		}
		fi.env = strings.Contains(m[2], "KVR_")
		flags[m[1]] = fi
	}
	if len(flags) < 50 || flags["http-addr"].def == "" {
		t.Fatalf("kvrouterd --help lists %d flags, --http-addr %+v: the parser here does not fit its output\n%s", len(flags), flags["http-addr"], out.String())
	}
	return flags
}

// startDaemon starts a daemon in process on loopback ports with its data in a temporary
// directory, and returns its HTTP address once /readyz answers 200. set, if given, changes the
// configuration first.
func startDaemon(t *testing.T, set ...func(*daemon.Config)) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a daemon with its embedded NATS server")
	}
	c := daemon.Defaults()
	c.HTTPAddr, c.NATSListen, c.DataDir = freeport.TB(t), freeport.TB(t), t.TempDir()
	c.Shards, c.LogLevel, c.ShutdownTimeout = 2, "error", 5*time.Second
	for _, f := range set {
		f(&c)
	}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d, err := daemon.Start(ctx, c, io.Discard)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := d.Wait(ctx); err != nil { // ctx is done: Wait shuts down
			t.Errorf("daemon: %v", err)
		}
	})
	addr := d.Addr().String()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if code, _ := get(t, addr, "/readyz"); code == http.StatusOK {
			return addr
		}
		if time.Now().After(deadline) {
			_, body := get(t, addr, "/readyz")
			t.Fatalf("/readyz not 200 after 30 s: %s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get GETs path of the daemon at addr; status 0 when it does not answer.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// post POSTs a JSON body to the daemon at addr and fails the test unless it answers 2xx.
func post(t *testing.T, addr, path, body string) string {
	t.Helper()
	code, answer := postStatus(t, addr, path, body)
	if code/100 != 2 {
		t.Fatalf("POST %s %s: %d %s", path, body, code, answer)
	}
	return answer
}

// postStatus POSTs a JSON body to the daemon at addr and returns its answer, whatever it is.
func postStatus(t *testing.T, addr, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

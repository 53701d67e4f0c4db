package deploy

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// object is one Kubernetes object of the manifests, as YAML decodes it, and its file.
type object struct {
	file string
	m    map[string]any
}

func (o object) kind() string { return str(o.m, "kind") }
func (o object) name() string { return str(o.m, "metadata", "name") }
func (o object) String() string {
	return fmt.Sprintf("%s %s (%s)", o.kind(), o.name(), o.file)
}

// at follows path (map keys and list indices) from v; nil where it leads nowhere.
func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func str(v any, path ...any) string {
	switch s := at(v, path...).(type) {
	case string:
		return s
	case int:
		return strconv.Itoa(s)
	}
	return ""
}

func list(v any, path ...any) []any { l, _ := at(v, path...).([]any); return l }

func labels(v any, path ...any) map[string]string {
	out := map[string]string{}
	m, _ := at(v, path...).(map[string]any)
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}

// selects says whether selector picks pods labelled podLabels.
func selects(selector, podLabels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if podLabels[k] != v {
			return false
		}
	}
	return true
}

// loadManifests decodes every YAML document of kubernetes/ but the kustomization, and checks
// the kustomization names exactly those files.
func loadManifests(t *testing.T) (objs []object, kustomization map[string]any) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in kubernetes/: %v", err)
	}
	for _, file := range files {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(f)
		for i := 0; ; i++ {
			var m map[string]any
			err := dec.Decode(&m)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s, document %d: %v", file, i+1, err)
			}
			if m == nil {
				t.Fatalf("%s, document %d: empty", file, i+1)
			}
			if filepath.Base(file) == "kustomization.yaml" {
				kustomization = m
				continue
			}
			objs = append(objs, object{filepath.Base(file), m})
		}
		f.Close()
	}
	if kustomization == nil {
		t.Fatal("kubernetes/ has no kustomization.yaml")
	}
	var resources []string
	for _, r := range list(kustomization, "resources") {
		resources = append(resources, fmt.Sprint(r))
	}
	var have []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			have = append(have, b)
		}
	}
	slices.Sort(resources)
	if !slices.Equal(resources, have) {
		t.Errorf("kustomization.yaml's resources %q, the directory's manifests %q: want the same", resources, have)
	}
	return objs, kustomization
}

// apiVersions are the kinds the manifests may use, at the versions current Kubernetes serves.
var apiVersions = map[string]string{
	"ConfigMap":           "v1",
	"Service":             "v1",
	"StatefulSet":         "apps/v1",
	"PodDisruptionBudget": "policy/v1",
	"NetworkPolicy":       "networking.k8s.io/v1",
}

// TestManifests parses every manifest of kubernetes/ and checks that what they name exists:
// the objects hang together (selectors, services, volumes, named ports, budgets); kvrouterd's
// image is the one make image builds, its flags and variables are flags of the built binary's
// --help, its port is its --http-addr, its --data-dir is its volume, its --nats-url names each
// NATS node and --nats-replicas their number, and its probe paths answer 200 on a daemon
// started in process; the NATS image is the nats-server release go.mod holds, and its
// configuration's ports, routes and store agree with its pods.
func TestManifests(t *testing.T) {
	objs, kust := loadManifests(t)
	seen := map[string]bool{}
	byKind := map[string][]object{}
	for _, o := range objs {
		if want, ok := apiVersions[o.kind()]; !ok || str(o.m, "apiVersion") != want {
			t.Errorf("%v: apiVersion %q, want one of %v", o, str(o.m, "apiVersion"), apiVersions)
		}
		if o.name() == "" || seen[o.kind()+"/"+o.name()] {
			t.Errorf("%v: no name, or a name used twice", o)
		}
		seen[o.kind()+"/"+o.name()] = true
		byKind[o.kind()] = append(byKind[o.kind()], o)
	}
	sets := map[string]object{}
	for _, s := range byKind["StatefulSet"] {
		sets[s.name()] = s
	}
	kvr, nats := sets["kvrouterd"], sets["nats"]
	if kvr.m == nil || nats.m == nil {
		t.Fatalf("want StatefulSets kvrouterd and nats, have %v", slices.Collect(maps.Keys(sets)))
	}
	podLabels := func(s object) map[string]string { return labels(s.m, "spec", "template", "metadata", "labels") }
	services := map[string]object{}
	for _, s := range byKind["Service"] {
		services[s.name()] = s
	}

	// Each StatefulSet: its selector, governing headless Service, volumes, named ports, probes
	// and resource requests.
	for _, s := range byKind["StatefulSet"] {
		if !selects(labels(s.m, "spec", "selector", "matchLabels"), podLabels(s)) {
			t.Errorf("%v: its selector does not select its own pods", s)
		}
		gov, ok := services[str(s.m, "spec", "serviceName")]
		if !ok || str(gov.m, "spec", "clusterIP") != "None" || !selects(labels(gov.m, "spec", "selector"), podLabels(s)) {
			t.Errorf("%v: serviceName %q is no headless Service of its pods", s, str(s.m, "spec", "serviceName"))
		}
		volumes := map[string]bool{}
		for _, v := range list(s.m, "spec", "template", "spec", "volumes") {
			volumes[str(v, "name")] = true
		}
		for _, v := range list(s.m, "spec", "volumeClaimTemplates") {
			volumes[str(v, "metadata", "name")] = true
		}
		containers := list(s.m, "spec", "template", "spec", "containers")
		if len(containers) == 0 {
			t.Errorf("%v: no containers", s)
		}
		for _, c := range containers {
			for _, vm := range list(c, "volumeMounts") {
				if !volumes[str(vm, "name")] {
					t.Errorf("%v: container %s mounts %q, which is no volume", s, str(c, "name"), str(vm, "name"))
				}
			}
			for _, probe := range []string{"startupProbe", "readinessProbe", "livenessProbe"} {
				if p := at(c, probe, "httpGet", "port"); p != nil && containerPort(c, fmt.Sprint(p)) == "" {
					t.Errorf("%v: %s's port %v is no port of container %s", s, probe, p, str(c, "name"))
				}
			}
			if str(c, "resources", "requests", "cpu") == "" || str(c, "resources", "requests", "memory") == "" {
				t.Errorf("%v: container %s requests no CPU or memory", s, str(c, "name"))
			}
		}
	}

	// Each Service selects a StatefulSet's pods, on ports they have.
	for _, svc := range byKind["Service"] {
		var pods object
		for _, s := range byKind["StatefulSet"] {
			if selects(labels(svc.m, "spec", "selector"), podLabels(s)) {
				pods = s
			}
		}
		if pods.m == nil {
			t.Errorf("%v selects no pods of the manifests", svc)
			continue
		}
		for _, p := range list(svc.m, "spec", "ports") {
			if podPort(pods, str(p, "targetPort")) == "" {
				t.Errorf("%v: targetPort %s is no port of %v", svc, str(p, "targetPort"), pods)
			}
		}
	}
	if svc := services["kvrouterd"]; svc.m == nil || str(svc.m, "spec", "ports", 0, "port") != "8090" {
		t.Errorf("want a Service kvrouterd on 8090 for the gateways, have %v", svc.m)
	}

	// Each budget covers one StatefulSet and leaves it a quorum: at most 1 of 3 NATS nodes, and
	// one router replica at least.
	for _, pdb := range byKind["PodDisruptionBudget"] {
		var covered []string
		for _, s := range byKind["StatefulSet"] {
			if selects(labels(pdb.m, "spec", "selector", "matchLabels"), podLabels(s)) {
				covered = append(covered, s.name())
				replicas, _ := at(s.m, "spec", "replicas").(int)
				unavailable, _ := at(pdb.m, "spec", "maxUnavailable").(int)
				least := 1 // a router replica serves alone
				if s.name() == "nats" {
					least = replicas/2 + 1 // the stream's quorum
				}
				if unavailable < 1 || replicas-unavailable < least {
					t.Errorf("%v: maxUnavailable %d of %d replicas of %s", pdb, unavailable, replicas, s.name())
				}
			}
		}
		if len(covered) != 1 {
			t.Errorf("%v covers %q: want one StatefulSet", pdb, covered)
		}
	}
	for _, s := range []string{"kvrouterd", "nats"} {
		if !seen["PodDisruptionBudget/"+s] {
			t.Errorf("no PodDisruptionBudget %s", s)
		}
	}

	t.Run("kvrouterd", func(t *testing.T) { checkRouter(t, kvr, nats, kust) })
	t.Run("nats", func(t *testing.T) { checkNATS(t, nats, byKind["ConfigMap"]) })
	t.Run("network policy", func(t *testing.T) { checkNetworkPolicy(t, byKind["NetworkPolicy"], kvr, nats) })
}

// containerPort is the number of the port named (or numbered) p of container c, or "".
func containerPort(c any, p string) string {
	for _, cp := range list(c, "ports") {
		if n := str(cp, "containerPort"); str(cp, "name") == p || n == p {
			return n
		}
	}
	return ""
}

// podPort is containerPort over the containers of StatefulSet s.
func podPort(s object, p string) string {
	for _, c := range list(s.m, "spec", "template", "spec", "containers") {
		if n := containerPort(c, p); n != "" {
			return n
		}
	}
	return ""
}

func checkRouter(t *testing.T, kvr, nats object, kust map[string]any) {
	c := at(kvr.m, "spec", "template", "spec", "containers", 0)
	// The image: the one make image tags, as the kustomization names it.
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^IMAGE\s*\?=\s*(\S+)`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile sets no IMAGE")
	}
	if image := str(c, "image"); image != string(m[1]) {
		t.Errorf("kvrouterd's image %q: want %q, which make image builds", image, m[1])
	}
	if str(kust, "images", 0, "name") != string(m[1]) {
		t.Errorf("kustomization.yaml's images name %q: want %q, so that an overlay can set its registry and tag", str(kust, "images", 0, "name"), m[1])
	}

	// Flags and variables: the built binary's.
	flags := daemonFlags(t)
	args := map[string]string{}
	for _, a := range list(c, "args") {
		name, value, ok := strings.Cut(strings.TrimPrefix(fmt.Sprint(a), "--"), "=")
		if !ok || !strings.HasPrefix(fmt.Sprint(a), "--") {
			t.Errorf("argument %q: want --flag=value", a)
			continue
		}
		if _, ok := flags[name]; !ok {
			t.Errorf("argument --%s: kvrouterd --help lists no such flag", name)
		}
		args[name] = value
	}
	for _, e := range list(c, "env") {
		name := str(e, "name")
		if flag, ok := strings.CutPrefix(name, "KVR_"); ok {
			flag = strings.ToLower(strings.ReplaceAll(flag, "_", "-"))
			if fi, ok := flags[flag]; !ok || !fi.env {
				t.Errorf("variable %s: kvrouterd --help lists no flag --%s with it", name, flag)
			}
		} else if name != "GOMAXPROCS" && name != "GOMEMLIMIT" {
			t.Errorf("variable %s: neither kvrouterd's (KVR_) nor the Go runtime's", name)
		}
	}
	setting := func(name string) string {
		if v, ok := args[name]; ok {
			return v
		}
		return flags[name].def
	}

	// The port is --http-addr's.
	_, httpPort, err := net.SplitHostPort(setting("http-addr"))
	if err != nil {
		t.Fatalf("--http-addr %q: %v", setting("http-addr"), err)
	}
	if containerPort(c, "http") != httpPort {
		t.Errorf("container port http %q: want %s, --http-addr's", containerPort(c, "http"), httpPort)
	}
	if ann := labels(kvr.m, "spec", "template", "metadata", "annotations"); ann["prometheus.io/port"] != httpPort || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v: want port %s, path /metrics", ann, httpPort)
	}

	// --data-dir is the persistent volume.
	claims := map[string]bool{}
	for _, v := range list(kvr.m, "spec", "volumeClaimTemplates") {
		claims[str(v, "metadata", "name")] = true
	}
	persistent := false
	for _, vm := range list(c, "volumeMounts") {
		persistent = persistent || claims[str(vm, "name")] && str(vm, "mountPath") == setting("data-dir")
	}
	if !persistent {
		t.Errorf("--data-dir %s is no mount of a volume claim: snapshots would die with the pod", setting("data-dir"))
	}

	// The stream: three replicas, on each NATS node by its stable name.
	natsReplicas := str(nats.m, "spec", "replicas")
	if setting("nats-replicas") != natsReplicas || natsReplicas != "3" {
		t.Errorf("--nats-replicas %s, NATS nodes %s: want 3 and 3", setting("nats-replicas"), natsReplicas)
	}
	var want []string
	n, _ := strconv.Atoi(natsReplicas)
	for i := range n {
		want = append(want, fmt.Sprintf("nats://%s-%d.%s:%s", nats.name(), i, str(nats.m, "spec", "serviceName"), podPort(nats, "client")))
	}
	if got := strings.Split(setting("nats-url"), ","); !slices.Equal(got, want) {
		t.Errorf("--nats-url %q: want %q, each node of the NATS StatefulSet", got, want)
	}

	// Probes: /readyz for readiness, /healthz for the others, and both answer a daemon.
	paths := map[string]string{}
	for _, probe := range []string{"startupProbe", "readinessProbe", "livenessProbe"} {
		paths[probe] = str(c, probe, "httpGet", "path")
	}
	if paths["readinessProbe"] != "/readyz" || paths["livenessProbe"] != "/healthz" || paths["startupProbe"] != "/healthz" {
		t.Errorf("probe paths %v: want readiness /readyz (gated on the stream replay), liveness and startup /healthz", paths)
	}
	addr := startDaemon(t)
	for probe, path := range paths {
		if code, body := get(t, addr, path); code != http.StatusOK {
			t.Errorf("%s %s: a ready daemon answers %d %q", probe, path, code, body)
		}
	}
}

func checkNATS(t *testing.T, nats object, configMaps []object) {
	c := at(nats.m, "spec", "template", "spec", "containers", 0)
	goMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/nats-io/nats-server/v2 v(\S+)`).FindSubmatch(goMod)
	if m == nil {
		t.Fatal("go.mod requires no nats-server")
	}
	if image := str(c, "image"); image != "nats:"+string(m[1]) && image != "nats:"+string(m[1])+"-alpine" {
		t.Errorf("NATS image %q: want nats:%s, the release kvrouterd is built and tested with", image, m[1])
	}

	// The configuration: mounted where --config reads it, its ports and store the pod's.
	var config string
	args := list(c, "args")
	for i, a := range args {
		if a == "--config" && i+1 < len(args) {
			config = fmt.Sprint(args[i+1])
		}
	}
	var volume string
	for _, vm := range list(c, "volumeMounts") {
		if str(vm, "mountPath") == filepath.Dir(config) {
			volume = str(vm, "name")
		}
	}
	var cmName string
	for _, v := range list(nats.m, "spec", "template", "spec", "volumes") {
		if str(v, "name") == volume {
			cmName = str(v, "configMap", "name")
		}
	}
	var conf string
	for _, cm := range configMaps {
		if cm.name() == cmName {
			conf = str(cm.m, "data", filepath.Base(config))
		}
	}
	if conf == "" {
		t.Fatalf("--config %q: no ConfigMap key mounted there (volume %q, ConfigMap %q)", config, volume, cmName)
	}
	setting := func(key string) string {
		m := regexp.MustCompile(`(?m)^\s*` + key + `:\s*(\S+)`).FindStringSubmatch(conf)
		if m == nil {
			t.Errorf("nats.conf sets no %s", key)
			return ""
		}
		return m[1]
	}
	port := func(key string) string {
		_, p, _ := net.SplitHostPort(setting(key))
		return p
	}
	for key, name := range map[string]string{"listen": "client", "http": "monitor"} {
		if p := port(key); p == "" || p != containerPort(c, name) {
			t.Errorf("nats.conf %s port %q: want the container's %s port %s", key, p, name, containerPort(c, name))
		}
	}
	cluster := conf[strings.Index(conf, "cluster {"):]
	if m := regexp.MustCompile(`listen:\s*\S+:(\d+)`).FindStringSubmatch(cluster); m == nil || m[1] != containerPort(c, "cluster") {
		t.Errorf("nats.conf's cluster listens on %v: want the container's cluster port %s", m, containerPort(c, "cluster"))
	}
	routes := regexp.MustCompile(`nats://\S+`).FindAllString(cluster, -1)
	var want []string
	n, _ := at(nats.m, "spec", "replicas").(int)
	for i := range n {
		want = append(want, (&url.URL{Scheme: "nats", Host: fmt.Sprintf("%s-%d.%s:%s", nats.name(), i, str(nats.m, "spec", "serviceName"), containerPort(c, "cluster"))}).String())
	}
	if !slices.Equal(routes, want) {
		t.Errorf("nats.conf routes %q: want %q, each node", routes, want)
	}
	if !strings.Contains(conf, "jetstream {") {
		t.Error("nats.conf does not turn JetStream on")
	}
	store := setting("store_dir")
	mounted := false
	for _, vm := range list(c, "volumeMounts") {
		mounted = mounted || str(vm, "mountPath") == store && str(vm, "name") == str(nats.m, "spec", "volumeClaimTemplates", 0, "metadata", "name")
	}
	if !mounted {
		t.Errorf("JetStream's store_dir %s is no mount of the volume claim", store)
	}
	env := map[string]bool{}
	for _, e := range list(c, "env") {
		env[str(e, "name")] = true
	}
	for _, v := range regexp.MustCompile(`\$([A-Z_]+)`).FindAllStringSubmatch(conf, -1) {
		if !env[v[1]] {
			t.Errorf("nats.conf reads $%s, which the container does not set", v[1])
		}
	}
}

func checkNetworkPolicy(t *testing.T, policies []object, kvr, nats object) {
	if len(policies) != 1 {
		t.Fatalf("%d NetworkPolicies: want the one that keeps the unauthenticated NATS cluster to its clients", len(policies))
	}
	p := policies[0]
	if !selects(labels(p.m, "spec", "podSelector", "matchLabels"), labels(nats.m, "spec", "template", "metadata", "labels")) {
		t.Fatalf("%v does not select the NATS pods", p)
	}
	client := podPort(nats, "client")
	routerAllowed := false
	for _, rule := range list(p.m, "spec", "ingress") {
		for _, port := range list(rule, "ports") {
			if podPort(nats, str(port, "port")) == "" {
				t.Errorf("%v opens port %s, which the NATS pods do not have", p, str(port, "port"))
			}
			if str(port, "port") != client {
				continue
			}
			if len(list(rule, "from")) == 0 {
				t.Errorf("%v opens the client port %s to every pod", p, client)
			}
			for _, from := range list(rule, "from") {
				routerAllowed = routerAllowed || selects(labels(from, "podSelector", "matchLabels"), labels(kvr.m, "spec", "template", "metadata", "labels"))
			}
		}
	}
	if !routerAllowed {
		t.Errorf("%v does not let the kvrouterd pods reach NATS on %s", p, client)
	}
}

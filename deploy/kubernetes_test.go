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

	"github.com/kvrouterd/kvrouterd/daemon"
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
// configuration's ports, routes and store agree with its pods. Each StatefulSet has a
// NetworkPolicy that lets in only what it serves. The auth component, applied to the base,
// passes --auth-token-file the Secret it mounts, and a daemon so configured still answers its
// probes and scrapes without a token.
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
	t.Run("network policy", func(t *testing.T) { checkNetworkPolicies(t, byKind["NetworkPolicy"], kvr, nats) })
	t.Run("auth", func(t *testing.T) { checkAuth(t, objs) })
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

// checkNetworkPolicies: one policy for each StatefulSet, letting in only what it serves.
func checkNetworkPolicies(t *testing.T, policies []object, kvr, nats object) {
	var forNATS, forRouter []object
	for _, p := range policies {
		sel := labels(p.m, "spec", "podSelector", "matchLabels")
		switch {
		case selects(sel, labels(nats.m, "spec", "template", "metadata", "labels")):
			forNATS = append(forNATS, p)
		case selects(sel, labels(kvr.m, "spec", "template", "metadata", "labels")):
			forRouter = append(forRouter, p)
		default:
			t.Errorf("%v selects neither the NATS nor the kvrouterd pods", p)
		}
	}
	if len(forNATS) != 1 || len(forRouter) != 1 {
		t.Fatalf("NetworkPolicies %v for NATS, %v for kvrouterd: want one each", forNATS, forRouter)
	}
	checkNATSPolicy(t, forNATS[0], kvr, nats)
	checkRouterPolicy(t, forRouter[0], kvr)
}

// checkNATSPolicy: the unauthenticated NATS cluster's client port is open to its clients
// only, kvrouterd among them.
func checkNATSPolicy(t *testing.T, p, kvr, nats object) {
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

// checkRouterPolicy: the router pods take connections on their HTTP port alone, from their
// own namespace (the gateways) and from Prometheus wherever it runs, never from everywhere.
func checkRouterPolicy(t *testing.T, p, kvr object) {
	if !slices.Contains(list(p.m, "spec", "policyTypes"), any("Ingress")) {
		t.Errorf("%v: policyTypes %v, want Ingress", p, list(p.m, "spec", "policyTypes"))
	}
	httpPort := podPort(kvr, "http")
	scrapePort := labels(kvr.m, "spec", "template", "metadata", "annotations")["prometheus.io/port"]
	namespace, prometheus := false, false
	for _, rule := range list(p.m, "spec", "ingress") {
		ports := list(rule, "ports")
		if len(ports) == 0 {
			t.Errorf("%v: a rule without ports opens every port of the pods", p)
		}
		opensHTTP := false
		for _, port := range ports {
			n := podPort(kvr, str(port, "port"))
			if n == "" {
				t.Errorf("%v opens port %s, which the kvrouterd pods do not have", p, str(port, "port"))
			}
			opensHTTP = opensHTTP || n == httpPort
		}
		if len(list(rule, "from")) == 0 {
			t.Errorf("%v opens %v to every source", p, ports)
		}
		for _, from := range list(rule, "from") {
			if !opensHTTP {
				continue
			}
			ps, hasPods := at(from, "podSelector").(map[string]any)
			namespace = namespace || hasPods && len(ps) == 0 && at(from, "namespaceSelector") == nil
			prometheus = prometheus || labels(from, "podSelector", "matchLabels")["app.kubernetes.io/name"] == "prometheus"
		}
	}
	if !namespace {
		t.Errorf("%v does not let the pods of the namespace (the gateways) reach port %s", p, httpPort)
	}
	if scrapePort != httpPort || !prometheus {
		t.Errorf("%v: the scrape port %s (the HTTP port %s) is not open to Prometheus's pods (app.kubernetes.io/name: prometheus)", p, scrapePort, httpPort)
	}
}

// applyComponent reads the kustomize Component in dir and returns the base's objects with its
// patches applied, and its kustomization's text. It knows JSON patches of "add" operations,
// and fails on anything else in the component rather than test less than it does.
func applyComponent(t *testing.T, dir string, base []object) ([]object, string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var kust map[string]any
	if err := yaml.Unmarshal(raw, &kust); err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	if str(kust, "kind") != "Component" || str(kust, "apiVersion") != "kustomize.config.k8s.io/v1alpha1" {
		t.Fatalf("%s: kind %q, apiVersion %q: want a kustomize Component", dir, str(kust, "kind"), str(kust, "apiVersion"))
	}
	for k := range kust {
		if k != "kind" && k != "apiVersion" && k != "patches" {
			t.Fatalf("%s: %s: the test applies patches only", dir, k)
		}
	}
	objs := make([]object, len(base))
	for i, o := range base {
		objs[i] = object{o.file, deepCopy(o.m).(map[string]any)}
	}
	for _, patch := range list(kust, "patches") {
		file := filepath.Join(dir, str(patch, "path"))
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var ops []any
		if err := yaml.Unmarshal(raw, &ops); err != nil {
			t.Fatalf("%s: %v (want a JSON patch, a list of operations)", file, err)
		}
		matched := 0
		for i, o := range objs {
			if o.kind() != str(patch, "target", "kind") || o.name() != str(patch, "target", "name") {
				continue
			}
			matched++
			for _, op := range ops {
				if str(op, "op") != "add" {
					t.Fatalf("%s: op %q: the test applies add only", file, str(op, "op"))
				}
				pointer, ok := strings.CutPrefix(str(op, "path"), "/")
				if !ok {
					t.Fatalf("%s: path %q is no JSON pointer", file, str(op, "path"))
				}
				var path []string
				for _, p := range strings.Split(pointer, "/") {
					path = append(path, strings.NewReplacer("~1", "/", "~0", "~").Replace(p))
				}
				m, err := jsonAdd(objs[i].m, path, at(op, "value"))
				if err != nil {
					t.Fatalf("%s: add %s to %v: %v", file, str(op, "path"), o, err)
				}
				objs[i].m = m.(map[string]any)
			}
		}
		if matched != 1 {
			t.Fatalf("%s: its target %v matches %d objects of the base, want 1", dir, at(patch, "target"), matched)
		}
	}
	return objs, string(raw)
}

// jsonAdd is a JSON patch's add of value at path in v. Unlike the RFC's, an add to a member
// that is there already fails: in a component it would replace what the base has.
func jsonAdd(v any, path []string, value any) (any, error) {
	key := path[0]
	switch c := v.(type) {
	case map[string]any:
		child, ok := c[key]
		if len(path) == 1 {
			if ok {
				return nil, fmt.Errorf("%s is there already: the add would replace it", key)
			}
			c[key] = value
			return c, nil
		}
		if !ok {
			return nil, fmt.Errorf("no member %s", key)
		}
		n, err := jsonAdd(child, path[1:], value)
		c[key] = n
		return c, err
	case []any:
		if len(path) == 1 && key == "-" {
			return append(c, value), nil
		}
		i, err := strconv.Atoi(key)
		if err != nil || i < 0 || i > len(c) || i == len(c) && len(path) > 1 {
			return nil, fmt.Errorf("no element %s of a list of %d", key, len(c))
		}
		if len(path) == 1 {
			return slices.Insert(c, i, value), nil
		}
		n, err := jsonAdd(c[i], path[1:], value)
		c[i] = n
		return c, err
	}
	return nil, fmt.Errorf("%s: neither an object nor a list", key)
}

func deepCopy(v any) any {
	switch c := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(c))
		for k, v := range c {
			m[k] = deepCopy(v)
		}
		return m
	case []any:
		l := make([]any, len(c))
		for i, v := range c {
			l[i] = deepCopy(v)
		}
		return l
	}
	return v
}

// checkAuth applies the component kubernetes/auth to the base: kvrouterd gets a flag of its
// --help, --auth-token-file, naming a file of a Secret volume mounted whole (a subPath mount
// would never see a rotation), and the component's instructions create that Secret with that
// key. A daemon with a token file answers the probes and the scrape without a token, and
// refuses the API.
func checkAuth(t *testing.T, base []object) {
	objs, text := applyComponent(t, filepath.Join("kubernetes", "auth"), base)
	var kvr object
	for _, o := range objs {
		if o.kind() == "StatefulSet" && o.name() == "kvrouterd" {
			kvr = o
		}
	}
	c := at(kvr.m, "spec", "template", "spec", "containers", 0)
	if _, ok := daemonFlags(t)["auth-token-file"]; !ok {
		t.Fatal("kvrouterd --help lists no --auth-token-file")
	}
	var file string
	for _, a := range list(c, "args") {
		if v, ok := strings.CutPrefix(fmt.Sprint(a), "--auth-token-file="); ok {
			file = v
		}
	}
	if !filepath.IsAbs(file) {
		t.Fatalf("the component passes kvrouterd no --auth-token-file=/absolute/path, args %v", list(c, "args"))
	}
	var mount any
	for _, vm := range list(c, "volumeMounts") {
		if str(vm, "mountPath") == filepath.Dir(file) {
			mount = vm
		}
	}
	if mount == nil {
		t.Fatalf("--auth-token-file %s: no volume is mounted at %s", file, filepath.Dir(file))
	}
	if str(mount, "subPath") != "" || at(mount, "readOnly") != true {
		t.Errorf("the token volume's mount %v: want it read-only and whole (no subPath)", mount)
	}
	var volume any
	for _, v := range list(kvr.m, "spec", "template", "spec", "volumes") {
		if str(v, "name") == str(mount, "name") {
			volume = v
		}
	}
	secret, key := str(volume, "secret", "secretName"), filepath.Base(file)
	if secret == "" {
		t.Fatalf("the volume %q mounted at %s is no Secret's: %v", str(mount, "name"), filepath.Dir(file), volume)
	}
	for _, item := range list(volume, "secret", "items") {
		if str(item, "path") == key {
			key = str(item, "key")
		}
	}
	create := regexp.MustCompile(`kubectl create secret generic (\S+) --from-file=([^=\s]+)=`)
	if m := create.FindStringSubmatch(text); m == nil || m[1] != secret || m[2] != key {
		t.Errorf("the component's kubectl create secret command %q: want it to create the Secret %s with the key %s, which the pods mount", m, secret, key)
	}
	deployment, err := os.ReadFile(filepath.Join(root, "docs", "deployment.md"))
	if err != nil {
		t.Fatal(err)
	}
	if m := create.FindStringSubmatch(string(deployment)); m == nil || m[1] != secret || m[2] != key {
		t.Errorf("docs/deployment.md's kubectl create secret command %q: want the Secret %s with the key %s", m, secret, key)
	}

	tokens := filepath.Join(t.TempDir(), key)
	if err := os.WriteFile(tokens, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := startDaemon(t, func(c *daemon.Config) { c.Security.AuthTokenFile = tokens }) // waits for /readyz
	paths := []string{labels(kvr.m, "spec", "template", "metadata", "annotations")["prometheus.io/path"]}
	for _, probe := range []string{"startupProbe", "readinessProbe", "livenessProbe"} {
		paths = append(paths, str(c, probe, "httpGet", "path"))
	}
	for _, path := range paths {
		if code, body := get(t, addr, path); code != http.StatusOK {
			t.Errorf("GET %s without a token: %d %q, want 200: the kubelet and Prometheus send none", path, code, body)
		}
	}
	if code, _ := get(t, addr, "/v1/workers"); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/workers without a token: %d, want 401", code)
	}
}

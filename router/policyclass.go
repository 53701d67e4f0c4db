package router

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Policy classes (Dynamo's --router-policy-config): a model's router queue split into named
// classes, each with its own queue, busy thresholds, limits, deadline and weight, served across
// classes by deficit round robin (DRR). A request names its class in the
// x-dynamo-meta-policy-class header; none names the profile's default class, and a name the
// profile does not configure is refused (ErrUnknownPolicyClass).
//
// The file is Dynamo main's flat schema, YAML or JSON (JSON is YAML), unknown fields refused:
//
//	default_policy_class: regular          # both or neither at the root
//	policy_classes:
//	  - name: premium                      # [A-Za-z0-9_.-]+, unique
//	    slo_ms: 600000                     # > 0: longest wait in the queue (its deadline)
//	    quantum: 512                       # > 0: DRR credit per round, in uncached tokens
//	    prefill_busy_threshold: 1536       # a rank is busy past this many prefill tokens
//	    prefill_busy_threshold_frac: 16.0  # or past this × its max batched tokens
//	    request_queue_limit_per_worker: 64 # × the model's workers: queued requests
//	    raw_isl_token_queue_limit_per_worker: 100000   # queued prompt tokens
//	    cached_token_queue_limit_per_worker: 100000    # queued cached tokens
//	models:                                # a model's profile replaces the root's
//	  my-model: {default_policy_class: …, policy_classes: […]}
//	worker_selection: …                    # accepted; kvrouterd has one worker selector
//
// A class queues only when it has a busy threshold and every rank its request may go to is busy
// by it, or requests of the class already wait (no overtaking within a class); otherwise its
// requests route at once, whatever other classes hold. Within a class requests are served in
// arrival order (their deadlines: arrival + slo_ms). Limits compare the class's queued requests,
// prompt tokens and cached tokens, before adding the new request, with the per-worker value ×
// the model's workers: the request that crosses a limit is queued, the next is refused
// (ErrPolicyClassLimit, HTTP 529). A request that waits past its deadline is refused
// (ErrPolicyClassDeadline, HTTP 529). A model with no profile keeps the single queue of
// --router-queue-threshold and --router-queue-policy.
//
// DRR: each class has a deficit, credit earned and not spent. A request's cost is its uncached
// prompt tokens when it was queued, at least 1. Visiting classes from a ring cursor, a class
// whose head cannot go (every rank busy) earns nothing and keeps its deficit; one whose deficit
// covers its head's cost sends it without new credit; else it earns one quantum and sends it if
// that suffices. When a whole ring sends nothing, every class with a head that can go earns the
// fewest whole rounds (quantum × rounds) that let one of them send. After a send the class pays
// the cost; an emptied class's deficit goes to 0; the cursor moves past the class, but a class
// with credit left is looked at first next time.

// Errors of policy classes.
var (
	// ErrUnknownPolicyClass: the request names a class its model's profile does not configure
	// (HTTP 400).
	ErrUnknownPolicyClass = errors.New("router: unknown policy class")
	// ErrPolicyClassLimit: the class's queue is at one of its limits (HTTP 529, Dynamo's).
	ErrPolicyClassLimit = errors.New("router: policy class queue limit reached")
	// ErrPolicyClassDeadline: the request waited past its class's slo_ms (HTTP 529, Dynamo's).
	ErrPolicyClassDeadline = errors.New("router: policy class deadline exceeded")
)

// PolicyClassHeader is the request header that names a request's policy class.
const PolicyClassHeader = "x-dynamo-meta-policy-class"

// PolicyClassError is a refusal by a policy class, with what Dynamo's structured 529 body
// carries in its details. It wraps ErrPolicyClassLimit or ErrPolicyClassDeadline. Immutable.
type PolicyClassError struct {
	Class string
	// Limit refusals: which limit (requests, raw_isl_tokens, cached_tokens), the class's use
	// before the request, and the limit (per worker × workers).
	LimitKind      string
	Current, Limit int64
	// Deadline refusals: where it passed (dispatch), the class's objective, how late.
	Stage            string
	SLOMs, OverdueMs int64
	err              error
}

func (e *PolicyClassError) Error() string {
	if e.err == ErrPolicyClassDeadline {
		return fmt.Sprintf("router policy class %q deadline exceeded at %s (slo=%dms, overdue=%dms)", e.Class, e.Stage, e.SLOMs, e.OverdueMs)
	}
	return fmt.Sprintf("router policy class %q queue %s limit reached (current=%d, limit=%d)", e.Class, e.LimitKind, e.Current, e.Limit)
}

func (e *PolicyClassError) Unwrap() error { return e.err }

// AppendJSON appends Dynamo's overload body for the refusal: message, type Overloaded, code
// status, and the details.
func (e *PolicyClassError) AppendJSON(dst []byte, status int) []byte {
	dst = append(dst, `{"message":`...)
	dst = appendJSONString(dst, e.Error())
	dst = fmt.Appendf(dst, `,"type":"Overloaded","code":%d,"details":{"policy_class":`, status)
	dst = appendJSONString(dst, e.Class)
	if e.err == ErrPolicyClassDeadline {
		dst = fmt.Appendf(dst, `,"stage":%q,"slo_ms":%d,"overdue_ms":%d}}`, e.Stage, e.SLOMs, e.OverdueMs)
	} else {
		dst = fmt.Appendf(dst, `,"limit_kind":%q,"current":%d,"limit":%d}}`, e.LimitKind, e.Current, e.Limit)
	}
	return dst
}

func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = fmt.Appendf(dst, `\u%04x`, c)
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// PolicyClass is one configured class. Immutable once parsed.
type PolicyClass struct {
	Name    string
	SLO     time.Duration
	Quantum int64
	// Busy thresholds, either firing: prefill tokens past BusyTokens (BusyTokens ≥ 0), or past
	// BusyFrac × max batched tokens (BusyFrac ≥ 0). Both negative: the class never queues.
	BusyTokens int64
	BusyFrac   float64
	// Per-worker limits, negative for none.
	RequestLimit, RawISLLimit, CachedLimit int64
}

func (c *PolicyClass) queues() bool { return c.BusyTokens >= 0 || c.BusyFrac >= 0 }

// PolicyProfile is a model's classes. Immutable.
type PolicyProfile struct {
	Classes []PolicyClass
	Default int // index of the default class
	byName  map[string]int
}

// resolve returns the index of the class name names ("" the default), -1 for none.
func (p *PolicyProfile) resolve(name string) int {
	if name == "" {
		return p.Default
	}
	if i, ok := p.byName[name]; ok {
		return i
	}
	return -1
}

// PolicyConfig is a parsed --router-policy-config. Immutable.
type PolicyConfig struct {
	Root   *PolicyProfile
	Models map[string]*PolicyProfile
	// WorkerSelection is set when the file has a worker_selection section, which kvrouterd
	// accepts without effect.
	WorkerSelection bool
}

// Profile returns model's profile: its own, else the root's, else nil (the single queue).
func (c *PolicyConfig) Profile(model string) *PolicyProfile {
	if c == nil {
		return nil
	}
	if p, ok := c.Models[model]; ok {
		return p
	}
	return c.Root
}

// LoadPolicyConfig reads and parses the file at path.
func LoadPolicyConfig(path string) (*PolicyConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("router policy config: %w", err)
	}
	c, err := ParsePolicyConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

type rawClass struct {
	Name         *string  `yaml:"name"`
	SLOMs        *int64   `yaml:"slo_ms"`
	Quantum      *int64   `yaml:"quantum"`
	BusyTokens   *int64   `yaml:"prefill_busy_threshold"`
	BusyFrac     *float64 `yaml:"prefill_busy_threshold_frac"`
	RequestLimit *int64   `yaml:"request_queue_limit_per_worker"`
	RawISLLimit  *int64   `yaml:"raw_isl_token_queue_limit_per_worker"`
	CachedLimit  *int64   `yaml:"cached_token_queue_limit_per_worker"`
}

type rawProfile struct {
	Default *string    `yaml:"default_policy_class"`
	Classes []rawClass `yaml:"policy_classes"`
}

type rawPolicyConfig struct {
	Default         *string               `yaml:"default_policy_class"`
	Classes         []rawClass            `yaml:"policy_classes"`
	Models          map[string]rawProfile `yaml:"models"`
	WorkerSelection *yaml.Node            `yaml:"worker_selection"`
}

// ParsePolicyConfig parses a policy config (YAML or JSON). An error names the field at fault
// and where it is.
func ParsePolicyConfig(data []byte) (*PolicyConfig, error) {
	var raw rawPolicyConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil {
		if err == io.EOF {
			return nil, errors.New("router policy config: empty")
		}
		return nil, fmt.Errorf("router policy config: %w", err)
	}
	c := &PolicyConfig{WorkerSelection: raw.WorkerSelection != nil}
	switch {
	case raw.Default == nil && raw.Classes == nil:
	case raw.Default != nil && raw.Classes != nil:
		p, err := parseProfile(rawProfile{raw.Default, raw.Classes}, "")
		if err != nil {
			return nil, err
		}
		c.Root = p
	default:
		return nil, errors.New("router policy config: default_policy_class and policy_classes go together at the root")
	}
	names := make([]string, 0, len(raw.Models))
	for name := range raw.Models {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == "" {
			return nil, errors.New("router policy config: models: a model name is empty")
		}
		if c.Models == nil {
			c.Models = make(map[string]*PolicyProfile, len(names))
		}
		rp := raw.Models[name]
		if rp.Default == nil || rp.Classes == nil {
			return nil, fmt.Errorf("router policy config: models.%s: default_policy_class and policy_classes are both required", name)
		}
		p, err := parseProfile(rp, "models."+name+".")
		if err != nil {
			return nil, err
		}
		c.Models[name] = p
	}
	if c.Root == nil && c.Models == nil && !c.WorkerSelection {
		return nil, errors.New("router policy config: defines no policy_classes, models or worker_selection")
	}
	return c, nil
}

func parseProfile(rp rawProfile, at string) (*PolicyProfile, error) {
	if len(rp.Classes) == 0 {
		return nil, fmt.Errorf("router policy config: %spolicy_classes: empty", at)
	}
	p := &PolicyProfile{byName: make(map[string]int, len(rp.Classes))}
	for i, rc := range rp.Classes {
		field := fmt.Sprintf("%spolicy_classes[%d]", at, i)
		cl, err := parseClass(rc, field)
		if err != nil {
			return nil, err
		}
		if _, dup := p.byName[cl.Name]; dup {
			return nil, fmt.Errorf("router policy config: %s.name: class %q defined twice", field, cl.Name)
		}
		p.byName[cl.Name] = len(p.Classes)
		p.Classes = append(p.Classes, cl)
	}
	if err := checkName(*rp.Default); err != nil {
		return nil, fmt.Errorf("router policy config: %sdefault_policy_class: %v", at, err)
	}
	d, ok := p.byName[*rp.Default]
	if !ok {
		return nil, fmt.Errorf("router policy config: %sdefault_policy_class: %q names no class of policy_classes", at, *rp.Default)
	}
	p.Default = d
	return p, nil
}

func parseClass(rc rawClass, field string) (PolicyClass, error) {
	bad := func(name, format string, a ...any) (PolicyClass, error) {
		return PolicyClass{}, fmt.Errorf("router policy config: %s.%s: %s", field, name, fmt.Sprintf(format, a...))
	}
	if rc.Name == nil {
		return bad("name", "required")
	}
	if err := checkName(*rc.Name); err != nil {
		return bad("name", "%v", err)
	}
	if rc.SLOMs == nil {
		return bad("slo_ms", "required")
	}
	if *rc.SLOMs <= 0 {
		return bad("slo_ms", "%d: must be greater than zero", *rc.SLOMs)
	}
	if rc.Quantum == nil {
		return bad("quantum", "required")
	}
	if *rc.Quantum <= 0 {
		return bad("quantum", "%d: must be greater than zero", *rc.Quantum)
	}
	cl := PolicyClass{Name: *rc.Name, SLO: time.Duration(*rc.SLOMs) * time.Millisecond, Quantum: *rc.Quantum,
		BusyTokens: -1, BusyFrac: -1, RequestLimit: -1, RawISLLimit: -1, CachedLimit: -1}
	if rc.BusyTokens != nil {
		if *rc.BusyTokens < 0 {
			return bad("prefill_busy_threshold", "%d: must not be negative", *rc.BusyTokens)
		}
		cl.BusyTokens = *rc.BusyTokens
	}
	if rc.BusyFrac != nil {
		if f := *rc.BusyFrac; math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
			return bad("prefill_busy_threshold_frac", "%v: must be finite and not negative", f)
		}
		cl.BusyFrac = *rc.BusyFrac
	}
	for _, l := range []struct {
		name string
		v    *int64
		dst  *int64
	}{{"request_queue_limit_per_worker", rc.RequestLimit, &cl.RequestLimit},
		{"raw_isl_token_queue_limit_per_worker", rc.RawISLLimit, &cl.RawISLLimit},
		{"cached_token_queue_limit_per_worker", rc.CachedLimit, &cl.CachedLimit}} {
		if l.v == nil {
			continue
		}
		if *l.v < 0 {
			return bad(l.name, "%d: must not be negative", *l.v)
		}
		*l.dst = *l.v
	}
	return cl, nil
}

// checkName checks a class name: [A-Za-z0-9_.-]+, as Dynamo's metric-safe identifiers.
func checkName(s string) error {
	if s == "" {
		return errors.New("empty name")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("%q must match [A-Za-z0-9_.-]+", s)
		}
	}
	return nil
}

// PolicyClassOf returns the class a header value names: trimmed, "" for none (the default).
func PolicyClassOf(header string) string { return strings.TrimSpace(header) }

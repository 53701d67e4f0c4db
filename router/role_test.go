package router

import (
	"errors"
	"testing"

	"github.com/kvrouterd/kvrouterd/wire"
)

func TestParseRole(t *testing.T) {
	for s, want := range map[string]Role{"": RoleBoth, "both": RoleBoth, "aggregated": RoleBoth, "prefill": RolePrefill, "decode": RoleDecode} {
		if got, err := ParseRole(s); err != nil || got != want {
			t.Errorf("ParseRole(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	var fe *FieldError
	if _, err := ParseRole("encode"); !errors.As(err, &fe) || fe.Field != "role" || !errors.Is(err, ErrInvalid) {
		t.Errorf("ParseRole(encode) = %v, want an invalid role", err)
	}
	for _, r := range []Role{RoleBoth, RolePrefill, RoleDecode} {
		if got, err := ParseRole(r.String()); err != nil || got != r {
			t.Errorf("%v does not round-trip: %v %v", r, got, err)
		}
	}
}

func rolesOf(r *Router) map[uint64]string {
	out := map[uint64]string{}
	for _, w := range r.Workers() {
		out[w.ID] = w.Role
	}
	return out
}

// TestRegisterRole: a worker registers with a role, lists it, changes it by registering again,
// keeps it when a registration says KeepRole (a rank discovered by its events, a client naming
// no role), survives a snapshot and restore with it, and an unknown role is refused.
func TestRegisterRole(t *testing.T) {
	r := New(Config{Shards: 1, Logger: quiet()})
	defer r.Close()
	for _, g := range []Registration{
		{ID: 1, Model: "m", BlockSize: 16, Role: RolePrefill},
		{ID: 2, Model: "m", Role: RoleDecode},
		{ID: 3, Model: "m"},
		{ID: 4, Model: "m", Role: RolePrefill, KeepRole: true}, // a new worker takes it all the same
	} {
		if err := r.Register(g); err != nil {
			t.Fatal(err)
		}
	}
	want := map[uint64]string{1: "prefill", 2: "decode", 3: "both", 4: "prefill"}
	if got := rolesOf(r); !equalMaps(got, want) {
		t.Fatalf("roles %v, want %v", got, want)
	}
	l := r.model("m").list.Load()
	if len(l.prefill.keys) != 2 || len(l.serve.keys) != 2 || l.serve.keys[0].ID != 2 || l.prefill.keys[1].ID != 4 {
		t.Fatalf("pools: prefill %v, serve %v", l.prefill.keys, l.serve.keys)
	}
	// A rank added with KeepRole keeps the worker's role; without, the registration sets it.
	if err := r.Register(Registration{ID: 1, Model: "m", Ranks: []uint32{1}, KeepRole: true}); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(Registration{ID: 4, Model: "m", Role: RoleDecode}); err != nil {
		t.Fatal(err)
	}
	want[4] = "decode"
	if got := rolesOf(r); !equalMaps(got, want) {
		t.Fatalf("after re-registrations: roles %v, want %v", got, want)
	}
	l = r.model("m").list.Load()
	if len(l.prefill.keys) != 2 || l.prefill.keys[1] != (l.keys[1]) || len(l.serve.keys) != 3 {
		t.Fatalf("pools after the change: prefill %v, serve %v", l.prefill.keys, l.serve.keys)
	}
	var fe *FieldError
	if err := r.Register(Registration{ID: 5, Model: "m", Role: 7}); !errors.As(err, &fe) || fe.Field != "role" {
		t.Errorf("role 7: %v, want a refusal naming role", err)
	}
	to, _ := restored(t, r, 1<<20)
	if got := rolesOf(to); !equalMaps(got, want) {
		t.Fatalf("restored roles %v, want %v", got, want)
	}
	if l := to.model("m").list.Load(); len(l.prefill.keys) != 2 || len(l.serve.keys) != 3 {
		t.Fatalf("restored pools: prefill %v, serve %v", l.prefill.keys, l.serve.keys)
	}
	// Without a prefill worker the serve pool is the list itself.
	if err := r.Register(Registration{ID: 1, Model: "m", Role: RoleBoth}); err != nil {
		t.Fatal(err)
	}
	if l := r.model("m").list.Load(); l.serve != l || l.prefill != nil {
		t.Fatal("a model without prefill workers has pools apart from its list")
	}
}

// TestAggregatedSkipsPrefillWorkers: a request served whole never goes to a prefill worker,
// however well cached there; a model of prefill workers alone refuses it.
func TestAggregatedSkipsPrefillWorkers(t *testing.T) {
	r := fleet(t, 4)
	for _, id := range []uint64{1, 2, 3} {
		if err := r.Register(Registration{ID: id, Model: "m", Role: RolePrefill}); err != nil {
			t.Fatal(err)
		}
	}
	var resp wire.RouteResponse
	for i := range 20 {
		req := wire.RouteRequest{RequestID: string(rune('a' + i)), Model: "m", Tokens: familyPrompt(i % 4)}
		if err := r.Route(&req, &resp); err != nil {
			t.Fatal(err)
		}
		if resp.Worker != 4 || resp.Prefill {
			t.Fatalf("request %d went to worker %d (prefill %v)", i, resp.Worker, resp.Prefill)
		}
	}
	if err := r.Register(Registration{ID: 4, Model: "m", Role: RolePrefill}); err != nil {
		t.Fatal(err)
	}
	req := wire.RouteRequest{RequestID: "z", Model: "m", Tokens: familyPrompt(1)}
	if err := r.Route(&req, &resp); !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("a model of prefill workers alone: %v", err)
	}
	// A match still answers for every worker.
	if err := r.Match(&req, &resp); err != nil || len(resp.Candidates) != 4 {
		t.Fatalf("match: %d candidates, %v", len(resp.Candidates), err)
	}
}

func equalMaps(a, b map[uint64]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestDisaggConfigCheck(t *testing.T) {
	for _, c := range []DisaggConfig{
		{Policy: DisaggPrefillLoad}, // needs prefill_busy_threshold
		{Policy: DisaggISLOrLoad},   // the same
		{Policy: 9},                 // unknown
		{EffISLThreshold: -1},       // negative
		{HasDecodeBusyThreshold: true, DecodeBusyThreshold: -1}, // negative
	} {
		if err := c.withDefaults().Check(); err == nil {
			t.Errorf("%+v passed the check", c)
		}
	}
	for _, c := range []DisaggConfig{{}, {Policy: DisaggISLBounding}, {Policy: DisaggPrefillLoad, HasPrefillBusyThreshold: true}} {
		if err := c.withDefaults().Check(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	for s, want := range map[string]DisaggPolicy{"": DisaggNone, "none": DisaggNone, "isl_bounding": DisaggISLBounding, "prefill_load": DisaggPrefillLoad, "isl_or_load": DisaggISLOrLoad} {
		if got, err := ParseDisaggPolicy(s); err != nil || got != want || s != "" && got.String() != s {
			t.Errorf("ParseDisaggPolicy(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseDisaggPolicy("always"); err == nil {
		t.Error("ParseDisaggPolicy accepted always")
	}
}

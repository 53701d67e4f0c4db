package router

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// ranks returns n ranks from first on.
func ranks(first, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(first + i)
	}
	return out
}

// mustSnapshot snapshots r and fails the test unless every worker went in.
func mustSnapshot(t *testing.T, r *Router) {
	t.Helper()
	st, err := r.Snapshot(0, func([]byte) error { return nil })
	if err != nil || st.Skipped != 0 {
		t.Fatalf("snapshot: %+v %v", st, err)
	}
}

// Every registering path refuses, with the field named and nothing changed, what the snapshot
// format cannot hold; what it accepts at the limits snapshots.
func TestRegisterLimits(t *testing.T) {
	r := New(Config{Shards: 2, Logger: quiet()})
	defer r.Close()
	long := strings.Repeat("x", wire.MaxString+1)
	refused := func(what string, err error, field string, sentinel error) {
		t.Helper()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != field || !errors.Is(err, sentinel) {
			t.Errorf("%s: got %v, want a FieldError on %q wrapping %v", what, err, field, sentinel)
		}
		mustSnapshot(t, r)
	}
	f := func(g Registration, field string, sentinel error) {
		t.Helper()
		before := len(r.Workers())
		refused(fmt.Sprintf("Register(model %d bytes, %d ranks)", len(g.Model), len(g.Ranks)), r.Register(g), field, sentinel)
		if after := len(r.Workers()); after != before {
			t.Errorf("a refused registration changed the listing: %d ranks, then %d", before, after)
		}
	}
	f(Registration{ID: 1, Model: long}, "model", ErrTooLong)
	f(Registration{ID: 1, Model: ""}, "model", ErrInvalid)
	f(Registration{ID: 1, Model: "m", Endpoint: long}, "endpoint", ErrTooLong)
	f(Registration{ID: 1, Model: "m", Replay: long}, "replay_endpoint", ErrTooLong)
	f(Registration{ID: 1, Model: "m", Ranks: ranks(0, wire.MaxSnapshotRanks+1)}, "dp_ranks", ErrTooLong)
	f(Registration{ID: 1, Model: "m", Ranks: ranks(0, 100_000)}, "dp_ranks", ErrTooLong)
	f(Registration{ID: 1, Model: "m", BlockSize: wire.MaxBlockSize + 1}, "block_size", ErrInvalid)
	f(Registration{ID: 1, Model: "m", Capacity: -1}, "capacity_blocks", ErrInvalid)
	f(Registration{ID: 1, Model: "m", MaxTokens: -1}, "max_batched_tokens", ErrInvalid)

	// At the limits: accepted, duplicates counted once.
	at := strings.Repeat("y", wire.MaxString)
	// An endpoint at the limit whose later ranks' ports (1000 + r) stay four digits long.
	atEP := "tcp://" + strings.Repeat("h", wire.MaxString-len("tcp://:1000")) + ":1000"
	dup := append(ranks(0, wire.MaxSnapshotRanks-4), ranks(0, 100)...)
	if err := r.Register(Registration{ID: 1, Model: at, Endpoint: atEP, Replay: atEP, Ranks: dup, BlockSize: wire.MaxBlockSize}); err != nil {
		t.Fatal(err)
	}
	mustSnapshot(t, r)
	// The worker's ranks so far count towards its limit.
	f(Registration{ID: 1, Model: at, Ranks: ranks(wire.MaxSnapshotRanks-4, 5)}, "dp_ranks", ErrTooLong)
	if err := r.Register(Registration{ID: 1, Model: at, Ranks: ranks(wire.MaxSnapshotRanks-8, 8)}); err != nil {
		t.Fatal(err) // four already there, four new: 1,024
	}
	if n := len(r.Workers()); n != wire.MaxSnapshotRanks {
		t.Fatalf("%d ranks listed, want %d", n, wire.MaxSnapshotRanks)
	}
	f(Registration{ID: 1, Model: at, Ranks: []uint32{1 << 31}}, "dp_ranks", ErrTooLong)

	// Workers discovered from their events or load reports.
	before := len(r.Workers())
	ev := func(rank uint32) kvevent.Event {
		return kvevent.Event{Kind: kvevent.Stored, ID: 1, Rank: rank, BlockSize: 4, Hashes: []uint64{1}, Tokens: []uint32{1, 2, 3, 4}}
	}
	refused("Ingest, long model", r.Ingest(2, long, []kvevent.Event{ev(0)}), "model", ErrTooLong)
	many := make([]kvevent.Event, wire.MaxSnapshotRanks+1)
	for i := range many {
		many[i] = ev(uint32(i))
	}
	refused("Ingest, too many ranks", r.Ingest(2, "m", many), fmt.Sprintf("events[%d].dp_rank", wire.MaxSnapshotRanks), ErrTooLong)
	past := kvevent.Event{Kind: kvevent.Stored, ID: 1, Rank: 1 << 31, Hashes: []uint64{1}, Tokens: make([]uint32, 1<<16)} // one block of at's size
	refused("Ingest, a rank past the worker's limit", r.Ingest(1, at, []kvevent.Event{past}), "dp_ranks", ErrTooLong)
	refused("Report, long model", r.Report(&LoadReport{Worker: 3, Model: long}), "model", ErrTooLong)
	refused("Report, a rank past the worker's limit", r.Report(&LoadReport{Worker: 1, Model: at, Rank: 1 << 31}), "dp_ranks", ErrTooLong)
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	if after := len(r.Workers()); after != before {
		t.Errorf("refused events or reports changed the listing: %d ranks, then %d", before, after)
	}
	if err := r.Ingest(2, "m", many[:wire.MaxSnapshotRanks]); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	mustSnapshot(t, r)
}

// regGen makes random registrations, event batches and load reports, within the formats'
// limits and past them, about a few workers and models, so that they also conflict.
type regGen struct{ r *rand.Rand }

// str is empty, short, or about wire.MaxString bytes long: at, under or over.
func (g regGen) str(prefix string) string {
	switch g.r.IntN(5) {
	case 0:
		return ""
	case 1, 2, 3:
		return prefix + fmt.Sprint(g.r.IntN(3))
	}
	n := wire.MaxString - 2 + g.r.IntN(5)
	return strings.Repeat(prefix[:1], n)
}

func (g regGen) model() string {
	if s := g.str("model"); s != "" {
		return s
	}
	return "m"
}

func (g regGen) ranks() []uint32 {
	var n int
	switch g.r.IntN(6) {
	case 0:
		return nil
	case 1:
		n = wire.MaxSnapshotRanks - 3 + g.r.IntN(6)
	default:
		n = 1 + g.r.IntN(4)
	}
	out := make([]uint32, n)
	for i := range out {
		switch g.r.IntN(8) {
		case 0:
			out[i] = g.r.Uint32() // anywhere in the format's u32
		case 1:
			out[i] = out[g.r.IntN(i+1)] // a duplicate (or zero)
		default:
			out[i] = uint32(g.r.IntN(wire.MaxSnapshotRanks + 8))
		}
	}
	return out
}

func (g regGen) registration() Registration {
	return Registration{
		ID: uint64(1 + g.r.IntN(12)), Model: g.model(), Ranks: g.ranks(),
		BlockSize: []int{0, 4, 4, 4, 16, wire.MaxBlockSize, wire.MaxBlockSize + 1, -1}[g.r.IntN(8)],
		Capacity:  []int64{0, 0, 1, 1 << 40, 1<<63 - 1, -1}[g.r.IntN(6)], MaxTokens: []int64{0, 0, 8192, 1<<63 - 1, -5}[g.r.IntN(5)],
		Endpoint: g.str("tcp://e"), Replay: g.str("tcp://r"),
	}
}

// events is a batch of stored blocks at block size 4 for ranks of worker, numbered from id.
func (g regGen) events(id uint64) []kvevent.Event {
	rs := g.ranks()
	if len(rs) == 0 {
		rs = []uint32{0}
	}
	evs := make([]kvevent.Event, 0, len(rs))
	for i, rank := range rs {
		h := uint64(g.r.IntN(5))
		evs = append(evs, kvevent.Event{Kind: kvevent.Stored, ID: id + uint64(i), Rank: rank, BlockSize: 4,
			Hashes: []uint64{h, h + 1}, Tokens: []uint32{uint32(h), 1, 2, 3, uint32(h) + 1, 4, 5, 6}})
	}
	return evs
}

// listing is what a router lists and dumps of its workers and models: what a snapshot must
// carry. Load reports, active load and when the last events arrived are not persisted.
func listing(t *testing.T, r *Router) string {
	t.Helper()
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, w := range r.Workers() {
		// Live diagnostics, not persisted: a restarted router learns them again from the traffic.
		w.Report, w.EventLag, w.Problems, w.BlockSizeRefused, w.LastEventAt = nil, 0, nil, 0, time.Time{}
		fmt.Fprintf(&b, "%+v\n", w)
	}
	for _, m := range r.Models() {
		fmt.Fprintf(&b, "%+v\n", m)
		for _, id := range r.ModelWorkers(m.Name) {
			fmt.Fprintf(&b, "  %d: %v\n", id, r.DumpWorker(id, nil))
		}
	}
	return b.String()
}

// Whatever any registering path accepts survives snapshot → restore unchanged: registrations
// through Register, workers and ranks discovered from events and load reports, at, under and
// over every limit of the format.
func TestSnapshotRestoreAcceptedProperty(t *testing.T) {
	accepted, refused, listed := 0, 0, 0
	for seed := range uint64(6) {
		g := regGen{rand.New(rand.NewPCG(seed, 17))}
		live := New(Config{Shards: 2, Logger: quiet()})
		defer live.Close()
		var nextID uint64 = 1
		for range 100 {
			var err error
			switch g.r.IntN(4) {
			case 0, 1:
				err = live.Register(g.registration())
			case 2:
				evs := g.events(nextID)
				nextID += uint64(len(evs))
				err = live.Ingest(uint64(1+g.r.IntN(6)), g.model(), evs)
			case 3:
				rank := uint32(0)
				if rs := g.ranks(); len(rs) > 0 {
					rank = rs[len(rs)-1]
				}
				err = live.Report(&LoadReport{Worker: uint64(1 + g.r.IntN(12)), Model: g.model(), Rank: rank,
					MaxBatchedTokens: int64(g.r.IntN(3))})
			}
			if err != nil {
				var fe *FieldError
				if !errors.As(err, &fe) {
					t.Fatalf("seed %d: an error without a field: %v", seed, err)
				}
				refused++
				continue
			}
			accepted++
		}
		restart, st := restored(t, live, 1+int(seed)*5000)
		if st.Skipped != 0 {
			t.Fatalf("seed %d: %d workers left out of the snapshot", seed, st.Skipped)
		}
		if a, b := listing(t, live), listing(t, restart); a != b {
			t.Fatalf("seed %d: restored state differs:\nlive\n%.4000s\nrestored\n%.4000s", seed, a, b)
		}
		listed += len(live.Workers())
		if !reflect.DeepEqual(live.Models(), restart.Models()) {
			t.Fatalf("seed %d: models %+v, restored %+v", seed, live.Models(), restart.Models())
		}
	}
	t.Logf("%d accepted, %d refused; %d ranks listed", accepted, refused, listed)
	if accepted < 50 || refused < 50 {
		t.Fatalf("%d accepted, %d refused: the generator should exercise both", accepted, refused)
	}
}

// watchLog records the registrations an EndpointWatcher is told of; refuse, if set, is what
// Check answers.
type watchLog struct {
	got    [][]RankEndpoint
	refuse error
}

func (w *watchLog) Registered(_ uint64, _ string, eps []RankEndpoint) error {
	w.got = append(w.got, eps)
	return nil
}
func (w *watchLog) Unregistered(uint64)                        {}
func (w *watchLog) UnregisteredRank(uint64, uint32)            {}
func (w *watchLog) Check(uint64, string, []RankEndpoint) error { return w.refuse }

// The endpoint watcher counts a worker's ranks: it is told each once.
func TestRegisterTellsDistinctRanks(t *testing.T) {
	w := &watchLog{}
	r := New(Config{Logger: quiet(), Endpoints: w})
	defer r.Close()
	if err := r.Register(Registration{ID: 1, Model: "m", Endpoint: "tcp://e:5557", Ranks: []uint32{3, 2, 3, 2}}); err != nil {
		t.Fatal(err)
	}
	want := []RankEndpoint{{Rank: 2, Endpoint: "tcp://e:5557"}, {Rank: 3, Endpoint: "tcp://e:5558"}}
	if len(w.got) != 1 || !reflect.DeepEqual(w.got[0], want) {
		t.Fatalf("the watcher was told %+v, want %+v once", w.got, want)
	}
}

// A worker the format cannot hold, should one get past Register, is left out of the snapshot,
// counted, and the others are written.
func TestSnapshotLeavesOutWhatTheFormatCannotHold(t *testing.T) {
	r := New(Config{Logger: quiet()})
	defer r.Close()
	for id := uint64(1); id <= 3; id++ {
		if err := r.Register(Registration{ID: id, Model: "m", Ranks: []uint32{0, 1}}); err != nil {
			t.Fatal(err)
		}
	}
	// Only state past the format's limits gets here (a worker's blocks over 2^32-1 bytes); an
	// endpoint set behind Register's back stands in for it.
	r.mu.Lock()
	r.workers[2].ranks[1].endpoint = strings.Repeat("e", wire.MaxString+1)
	r.mu.Unlock()
	var chunks [][]byte
	st, err := r.Snapshot(0, func(c []byte) error { chunks = append(chunks, bytes.Clone(c)); return nil })
	if err != nil || st.Skipped != 1 || st.Workers != 2 || r.Stats().SnapshotSkipped != 1 {
		t.Fatalf("snapshot %+v %v, counter %d: want worker 2 alone left out", st, err, r.Stats().SnapshotSkipped)
	}
	restart := New(Config{Logger: quiet()})
	defer restart.Close()
	if _, err := restart.Restore(len(chunks), func(i int, dst []byte) ([]byte, error) { return append(dst, chunks[i]...), nil }); err != nil {
		t.Fatal(err)
	}
	if ids := restart.ModelWorkers("m"); !reflect.DeepEqual(ids, []uint64{1, 3}) {
		t.Fatalf("restored workers %v, want [1 3]", ids)
	}
}

// A registration whose endpoint the watcher refuses is refused whole: nothing is registered,
// the watcher is told of nothing, and the error names the endpoint.
func TestRegisterRefusedEndpointLeavesNothing(t *testing.T) {
	w := &watchLog{refuse: errors.New("no such host")}
	r := New(Config{Logger: quiet(), Endpoints: w})
	defer r.Close()
	err := r.Register(Registration{ID: 1, Model: "m", Ranks: []uint32{0, 1}, Endpoint: "tcp://h:5557"})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "endpoint" || !strings.Contains(err.Error(), "no such host") {
		t.Fatalf("Register: %v, want a refusal naming endpoint", err)
	}
	if ws, ms := r.Workers(), r.Models(); len(ws) != 0 || len(ms) != 0 || len(w.got) != 0 {
		t.Fatalf("a refused registration left workers %v, models %v, told the watcher %v", ws, ms, w.got)
	}
	w.refuse = nil
	if err := r.Register(Registration{ID: 1, Model: "m", Endpoint: "tcp://h:5557"}); err != nil || len(r.Workers()) != 1 {
		t.Fatalf("the same registration once the endpoint is taken: %v, %d workers", err, len(r.Workers()))
	}
}

package server

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

func keepTree(c *router.Config) { c.KeepTree = true }

// TestDynamoDumpRecovery: with --keep-block-tree, /dump answers in Dynamo's form — per
// "model:routing_group" the block size and stored events whose tokens_hash are Dynamo's local
// hashes and whose blocks chain onto parent_hash — and a fresh kvrouterd recovering from that
// dump through the peer path rebuilds the same index: the same dump, the same /query answers.
// Without the tree a partition's dump is Dynamo's error entry, which a peer's recovery refuses.
func TestDynamoDumpRecovery(t *testing.T) {
	a := newHarnessWith(t, keepTree)
	for _, body := range []string{
		`{"instance_id":7,"model_name":"m","block_size":4}`,
		`{"instance_id":7,"model_name":"m","block_size":4,"dp_rank":1}`,
		`{"instance_id":8,"model_name":"m","block_size":4,"routing_group":"g2"}`,
	} {
		if code, resp := a.post("/register", "", []byte(body)); code != 201 {
			t.Fatalf("register %s: %d %s", body, code, resp)
		}
	}
	// Worker 7 rank 0: a chain of 3 blocks, then a branch off its first block; rank 1: one
	// salted block. Worker 8 (group g2): 2 blocks.
	toks := tokens(0, 12)
	events := func(id uint64, model string, evs ...kvevent.Event) {
		t.Helper()
		res, err := a.c.Events(&wire.EventBatch{Worker: id, Model: model, Events: evs})
		if err != nil || res.OK != len(evs) {
			t.Fatalf("events of %d: %+v %v", id, res, err)
		}
	}
	events(7, "m",
		kvevent.Event{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{10, 11, 12}, Tokens: toks},
		kvevent.Event{Kind: kvevent.Stored, ID: 2, Hashes: []uint64{13}, Parent: 10, HasParent: true, Tokens: tokens(500, 4)},
		kvevent.Event{Kind: kvevent.Stored, ID: 1, Rank: 1, Hashes: []uint64{20}, Tokens: tokens(0, 4), Salt: "tenant-a"})
	events(8, "m@g2", kvevent.Event{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{30, 31}, Tokens: tokens(0, 8)})

	code, body := a.get("/dump")
	if code != 200 {
		t.Fatalf("dump: %d %s", code, body)
	}
	var dump map[string]struct {
		BlockSize int `json:"block_size"`
		Events    []struct {
			Worker uint64 `json:"worker_id"`
			Tier   string `json:"storage_tier"`
			Event  struct {
				Rank uint32 `json:"dp_rank"`
				Data struct {
					Stored struct {
						Parent *uint64 `json:"parent_hash"`
						Blocks []struct {
							Engine uint64 `json:"block_hash"`
							Tokens uint64 `json:"tokens_hash"`
						} `json:"blocks"`
					} `json:"stored"`
				} `json:"data"`
			} `json:"event"`
		} `json:"events"`
	}
	if err := json.Unmarshal([]byte(body), &dump); err != nil {
		t.Fatalf("dump is not JSON: %v\n%s", err, body)
	}
	if len(dump) != 2 || dump["m:default"].BlockSize != 4 || dump["m:g2"].BlockSize != 4 {
		t.Fatalf("dump partitions: %s", body)
	}
	var h radix.Hasher
	local := h.AppendLocal(nil, toks, 4, radix.BaseSeed)
	salted := h.AppendLocal(nil, tokens(0, 4), 4, radix.Seed("", "tenant-a"))
	branch := h.AppendLocal(nil, tokens(500, 4), 4, radix.BaseSeed)
	type blk struct {
		worker uint64
		rank   uint32
		parent int64 // -1: none
		engine uint64
		tokens uint64
	}
	var got []blk
	for _, e := range dump["m:default"].Events {
		if e.Tier != "device" {
			t.Errorf("storage_tier %q", e.Tier)
		}
		parent := int64(-1)
		if p := e.Event.Data.Stored.Parent; p != nil {
			parent = int64(*p)
		}
		for _, b := range e.Event.Data.Stored.Blocks {
			got = append(got, blk{e.Worker, e.Event.Rank, parent, b.Engine, b.Tokens})
			parent = int64(b.Engine)
		}
	}
	want := []blk{
		{7, 0, -1, 10, local[0]}, {7, 0, 10, 11, local[1]}, {7, 0, 11, 12, local[2]}, {7, 0, 10, 13, branch[0]},
		{7, 1, -1, 20, salted[0]},
	}
	if !slices.Equal(got, want) {
		t.Errorf("m:default blocks, parent-first with Dynamo's local hashes:\n got %v\nwant %v", got, want)
	}
	if n := len(dump["m:default"].Events); n != 3 {
		t.Errorf("m:default: %d events, want 3 (a chain is one event)", n)
	}

	// A fresh kvrouterd recovers from a's dump through the peer path.
	b := newHarnessWith(t, keepTree)
	st, err := b.s.RecoverFromPeers(t.Context(), []string{"http://127.0.0.1:1", "http://" + a.tcp}, 5*time.Second)
	if err != nil || st.Peer != "http://"+a.tcp || st.Partitions != 2 || st.Workers != 2 || st.Refused != 0 {
		t.Fatalf("recovery: %+v %v", st, err)
	}
	if _, again := b.get("/dump"); again != body {
		t.Errorf("the recovered index dumps\n%s\nwant\n%s", again, body)
	}
	for _, q := range []string{
		`{"model_name":"m","token_ids":[0,1,2,3,4,5,6,7,8,9,10,11]}`,
		`{"model_name":"m","token_ids":[0,1,2,3],"cache_salt":"tenant-a"}`,
		`{"model_name":"m","routing_group":"g2","token_ids":[0,1,2,3,4,5,6,7]}`,
	} {
		_, wantQ := a.post("/query", "", []byte(q))
		if _, gotQ := b.post("/query", "", []byte(q)); gotQ != wantQ || !strings.Contains(gotQ, `"longest_matched"`) {
			t.Errorf("query %s: recovered %s, original %s", q, gotQ, wantQ)
		}
	}
	if _, peers := b.get("/peers"); peers != `["http://127.0.0.1:1","http://`+a.tcp+`"]`+"\n" {
		t.Errorf("peers after recovery: %s", peers)
	}

	// Without the tree: Dynamo's error entry, refused by recovery.
	c := newHarness(t)
	if code, _ := c.post("/register", "", []byte(`{"instance_id":9,"model_name":"m","block_size":4}`)); code != 201 {
		t.Fatal("register")
	}
	if _, d := c.get("/dump"); !strings.Contains(d, `"m:default":{"error":"kvrouterd keeps no block tree`) {
		t.Errorf("dump without the tree: %s", d)
	}
	if _, err := b.s.RecoverFromPeers(t.Context(), []string{"http://" + c.tcp}, 5*time.Second); err == nil ||
		!strings.Contains(err.Error(), "no reachable peers") {
		t.Errorf("recovery from a dump of error entries: %v", err)
	}
}

// TestDynamoDumpTiers: /dump lists a worker's lower-tier blocks after its device blocks, tagged
// host_pinned and chained onto the device block they were offloaded under; a kvrouterd
// recovering from that dump rebuilds the host tier: the same dump, and /query's cpu counts it.
func TestDynamoDumpTiers(t *testing.T) {
	a := newHarnessWith(t, keepTree)
	if code, resp := a.post("/register", "", []byte(`{"instance_id":7,"model_name":"m","block_size":4}`)); code != 201 {
		t.Fatalf("register: %d %s", code, resp)
	}
	evs := []kvevent.Event{
		{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{10, 11}, Tokens: tokens(0, 8)},
		{Kind: kvevent.Stored, ID: 2, Tier: kvevent.Host, Hashes: []uint64{12}, Parent: 11, HasParent: true, Tokens: tokens(8, 4)},
	}
	if res, err := a.c.Events(&wire.EventBatch{Worker: 7, Model: "m", Events: evs}); err != nil || res.OK != 2 {
		t.Fatalf("events: %+v %v", res, err)
	}
	_, body := a.get("/dump")
	host := `"storage_tier":"host_pinned","event":{"event_id":1,"dp_rank":0,"data":{"stored":{"parent_hash":11,`
	if i, j := strings.Index(body, `"storage_tier":"device"`), strings.Index(body, host); i < 0 || j < i {
		t.Fatalf("dump without the host block after the device's:\n%s", body)
	}
	b := newHarnessWith(t, keepTree)
	if st, err := b.s.RecoverFromPeers(t.Context(), []string{"http://" + a.tcp}, 5*time.Second); err != nil || st.Refused != 0 {
		t.Fatalf("recovery: %+v %v", st, err)
	}
	if _, again := b.get("/dump"); again != body {
		t.Errorf("the recovered index dumps\n%s\nwant\n%s", again, body)
	}
	q := []byte(`{"model_name":"m","token_ids":[0,1,2,3,4,5,6,7,8,9,10,11]}`)
	_, got := b.post("/query", "", q)
	if !strings.Contains(got, `"7":{"longest_matched":12,"gpu":8,"dp":{"0":8},"cpu":12,"disk":12}`) {
		t.Errorf("query after recovery: %s", got)
	}
}

// TestDynamoPeers: /register_peer, /deregister_peer and /peers as Dynamo answers them.
func TestDynamoPeers(t *testing.T) {
	h := newHarness(t)
	for _, c := range []struct {
		path, body string
		code       int
		want       string
	}{
		{"/register_peer", `{"url":"http://b:8090"}`, 201, `{"status":"ok"}`},
		{"/register_peer", `{"url":"http://b:8090","extra":1}`, 201, `{"status":"ok"}`},
		{"/register_peer", `{"url":"http://a:8090"}`, 201, `{"status":"ok"}`},
		{"/register_peer", `{}`, 422, "missing field `url`"},
		{"/deregister_peer", `{"url":"http://c:8090"}`, 404, `{"error":"peer not found"`},
		{"/deregister_peer", `{"url":"http://b:8090"}`, 200, `{"status":"ok"}`},
	} {
		if code, body := h.post(c.path, "application/json", []byte(c.body)); code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%s %s: %d %s, want %d %s", c.path, c.body, code, body, c.code, c.want)
		}
	}
	if code, body := h.get("/peers"); code != 200 || body != `["http://a:8090"]`+"\n" {
		t.Errorf("peers: %d %s", code, body)
	}
	if code, body := h.post("/reopen_logs", "", nil); code != 200 || !strings.Contains(body, `"ok"`) {
		t.Errorf("reopen_logs without a log file: %d %s", code, body)
	}
}

// TestDynamoNullFields: null in a field Dynamo requires, or in a string field with a default,
// is Dynamo's 422; it once reached a nil pointer and crashed the daemon.
func TestDynamoNullFields(t *testing.T) {
	h := newHarness(t)
	for _, c := range []struct{ path, body string }{
		{"/register", `{"instance_id":null,"model_name":"m","block_size":4}`},
		{"/register", `{"instance_id":1,"model_name":"m","block_size":null}`},
		{"/register", `{"instance_id":1,"model_name":null,"block_size":4}`},
		{"/register", `{"instance_id":1,"model_name":"m","block_size":4,"routing_group":null}`},
		{"/register", `{"instance_id":1,"model_name":"m","block_size":4,"tenant_id":null}`},
		{"/unregister", `{"instance_id":null,"model_name":"m"}`},
		{"/query", `{"token_ids":null,"model_name":"m"}`},
		{"/query", `{"token_ids":[1],"model_name":"m","routing_group":null}`},
		{"/query_by_hash", `{"block_hashes":null,"model_name":"m"}`},
		{"/register_peer", `{"url":null}`},
		{"/deregister_peer", `{"url":null}`},
	} {
		if code, body := h.post(c.path, "application/json", []byte(c.body)); code != 422 {
			t.Errorf("%s %s: %d %s, want 422", c.path, c.body, code, body)
		}
	}
	if code, _ := h.get("/health"); code != 200 {
		t.Fatal("the server is gone")
	}
}

package mocker

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// prefillBody is a prefill request as vLLM's toy proxy and Dynamo's frontend send it: the
// prompt, one token, not streamed, do_remote_decode with the remote fields null.
func prefillBody(prompt []uint32) string {
	return fmt.Sprintf(`{"prompt":%s,"max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,`+
		`"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`,
		jsonOf(prompt))
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// prefill runs a prefill request on m and returns its answer's kv_transfer_params, raw.
func prefill(t *testing.T, m *Mocker, prompt []uint32) json.RawMessage {
	t.Helper()
	code, b := post(t, m, "/v1/completions", prefillBody(prompt))
	var a struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage  usage           `json:"usage"`
		Params json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(b, &a); code != 200 || err != nil || a.Usage.Completion != 1 || len(a.Params) == 0 {
		t.Fatalf("prefill answer: %d %s", code, b)
	}
	return a.Params
}

// decode runs a decode request of n tokens carrying params on m and returns its usage.
func decode(t *testing.T, m *Mocker, prompt []uint32, n int, params json.RawMessage) usage {
	t.Helper()
	code, b := post(t, m, "/v1/completions", fmt.Sprintf(`{"prompt":%s,"max_tokens":%d,"kv_transfer_params":%s}`, jsonOf(prompt), n, params))
	if code != 200 {
		t.Fatalf("decode answer: %d %s", code, b)
	}
	a := decodeAnswer(t, b)
	if got := *a.Choices[0].Text; got != expectText(prompt, n) {
		t.Fatalf("decode text %q, want %q", got, expectText(prompt, n))
	}
	return *a.Usage
}

func promptOf(from, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(from + i)
	}
	return p
}

// TestDisaggregatedTransfer: a prefill request on the prefill worker holds its blocks and answers
// NixlConnector's parameters; the decode request carrying them reads the blocks (paying the
// modelled transfer), stores them as vLLM's decode side caches received blocks, computes only
// the last prompt token, and frees the prefill worker's blocks. The same parameters again find
// nothing to read, and the decode worker computes what it lacks instead.
func TestDisaggregatedTransfer(t *testing.T) {
	p := start(t, func(c *Config) { c.Role = "prefill"; c.WorkerID = 1 })
	d := start(t, func(c *Config) { c.Role = "decode"; c.WorkerID = 2 })
	prompt := promptOf(1000, 40) // blocks of 16: two full, one of 8

	raw := prefill(t, p, prompt)
	var params kvTransferParams
	if err := json.Unmarshal(raw, &params); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(p.Addr())
	if !params.DoRemotePrefill || params.DoRemoteDecode || len(params.RemoteBlockIDs) != 3 || params.RemoteHost != host ||
		strconv.Itoa(params.RemotePort) != port || !strings.HasPrefix(params.RemoteEngineID, "kvr-mock-1-") ||
		!strings.HasPrefix(params.RemoteRequestID, "cmpl-") || params.TPSize != 1 {
		t.Fatalf("prefill's kv_transfer_params %s", raw)
	}
	waitUntil(t, "the prefill's blocks held", func() bool { return p.Stats().Held == 1 })
	if st := p.Stats(); st.ComputedTokens != 40 || st.Usage == 0 {
		t.Fatalf("prefill worker: %+v", st)
	}

	u := decode(t, d, prompt, 5, raw)
	if u.Prompt != 40 || u.Completion != 5 || u.Details.Cached != 39 {
		t.Errorf("decode usage %+v: want the 39 transferred tokens counted as cached, as vLLM does", u)
	}
	bytes, cost := d.cfg.transferCost(3)
	if bytes != 3*16*131072 || cost != time.Millisecond+time.Duration(float64(bytes)*8/400e9*1e9) {
		t.Fatalf("transfer cost of 3 blocks: %d bytes, %v", bytes, cost)
	}
	st := d.Stats()
	if st.Received != 1 || st.BlocksIn != 3 || st.BytesIn != bytes || st.TransferTime != cost || st.Failed != 0 {
		t.Errorf("decode worker's transfers %+v", st.Transfers)
	}
	if st.ComputedTokens != 1 || st.RemoteTokens != 39 || st.CachedTokens != 0 {
		t.Errorf("decode worker computed %d prompt tokens (%d remote, %d cached); want only the last one",
			st.ComputedTokens, st.RemoteTokens, st.CachedTokens)
	}
	waitUntil(t, "the prefill's blocks released", func() bool { return p.Stats().Held == 0 })
	if st := p.Stats(); st.Sent != 1 || st.Expired != 0 || st.Usage != 0 {
		t.Errorf("prefill worker after the read: %+v", st)
	}
	// The decode worker published its two full received blocks as stored, as vLLM's does.
	if _, evs := events(t, d); !slices.Equal(storedTokens(evs), prompt[:32]) {
		t.Errorf("decode worker's stored blocks %v, want the prompt's first 32 tokens", storedTokens(evs))
	}

	// Read again: the prefill worker has freed the blocks. The decode worker computes the
	// prompt past its own cache hit (two blocks) instead.
	if u := decode(t, d, prompt, 2, raw); u.Details.Cached != 32 {
		t.Errorf("usage after a failed read %+v", u)
	}
	if st := d.Stats(); st.Failed != 1 || st.Received != 1 || st.ComputedTokens != 1+8 {
		t.Errorf("decode worker after a failed read: %+v", st)
	}
}

// TestTransferReadsOnlyWhatIsMissing: the decode worker reads only the blocks past its own
// prefix-cache hit, as NixlConnector reads only the blocks it had to allocate.
func TestTransferReadsOnlyWhatIsMissing(t *testing.T) {
	p := start(t, func(c *Config) { c.Role = "prefill"; c.WorkerID = 1 })
	d := start(t, func(c *Config) { c.Role = "decode"; c.WorkerID = 2 })
	prompt := promptOf(2000, 40)
	if code, b := post(t, d, "/v1/completions", fmt.Sprintf(`{"prompt":%s,"max_tokens":1}`, jsonOf(prompt[:33]))); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	waitUntil(t, "the decode worker's two blocks cached", func() bool { return d.Stats().CachedBlocks == 2 })
	decode(t, d, prompt, 3, prefill(t, p, prompt))
	st := d.Stats()
	if _, cost := d.cfg.transferCost(1); st.BlocksIn != 1 || st.TransferTime != cost || st.RemoteTokens != 40-1-32 || st.CachedTokens != 32 {
		t.Errorf("decode worker %+v", st)
	}
	waitUntil(t, "the prefill's blocks released", func() bool { st := p.Stats(); return st.Held == 0 && st.Sent == 1 })
}

// TestTransferExpires: blocks no decode worker reads are freed after --kv-transfer-timeout
// (simulated time: 50 s at a speedup of 1000), and a late decode request computes its prompt.
func TestTransferExpires(t *testing.T) {
	p := start(t, func(c *Config) { c.KVTransferTimeout = 50 * time.Second })
	d := start(t, func(c *Config) { c.WorkerID = 2 })
	prompt := promptOf(3000, 20)
	raw := prefill(t, p, prompt)
	waitUntil(t, "the unread blocks expired", func() bool { st := p.Stats(); return st.Expired == 1 && st.Held == 0 })
	decode(t, d, prompt, 2, raw)
	if st := d.Stats(); st.Failed != 1 || st.Received != 0 || st.ComputedTokens != 20 {
		t.Errorf("decode worker %+v", st)
	}
}

// TestTransferErrors: kv_transfer_params NixlConnector could not act on are refused, naming the
// field; so are reads of blocks the prefill worker does not hold.
func TestTransferErrors(t *testing.T) {
	m := start(t, nil)
	prompt := jsonOf(promptOf(100, 20))
	f := func(path, body string, code int, want string) {
		t.Helper()
		got, b := post(t, m, path, body)
		if got != code || !strings.Contains(string(b), want) {
			t.Errorf("%s %s: %d %s, want %d with %q", path, body, got, b, code, want)
		}
	}
	remote := `"remote_engine_id":"e","remote_request_id":"r","remote_host":"127.0.0.1","remote_port":1`
	f("/v1/completions", `{"prompt":`+prompt+`,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":true}}`, 400, "both true")
	f("/v1/completions", `{"prompt":`+prompt+`,"stream":true,"kv_transfer_params":{"do_remote_decode":true}}`, 400, "must not stream")
	f("/v1/completions", `{"prompt":`+prompt+`,"kv_transfer_params":{"do_remote_prefill":true,`+remote+`}}`, 400, "remote_block_ids")
	f("/v1/completions", `{"prompt":`+prompt+`,"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2]}}`, 400, "remote_engine_id")
	f("/v1/completions", `{"prompt":`+prompt+`,"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1],`+remote+`}}`, 400, "remote_block_ids: 1 blocks")
	f("/v1/completions", `{"prompt":`+prompt+`,"kv_transfer_params":{"remote_port":"x"}}`, 400, "remote_port")
	f("/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":0}}`, 400, "remote_port")
	engine := m.api.engineID
	f("/kv_transfer/read", `{"remote_engine_id":"other","remote_request_id":"x"}`, 400, "remote_engine_id")
	f("/kv_transfer/read", `{"remote_engine_id":"`+engine+`","remote_request_id":"x"}`, 404, "no KV blocks held")
	f("/kv_transfer/release", `{"remote_engine_id":"`+engine+`","remote_request_id":"x"}`, 404, "no KV blocks held")

	var params kvTransferParams
	if err := json.Unmarshal(prefill(t, m, promptOf(100, 20)), &params); err != nil {
		t.Fatal(err)
	}
	f("/kv_transfer/read", fmt.Sprintf(`{"remote_engine_id":%q,"remote_request_id":%q,"remote_block_ids":[9999]}`,
		engine, params.RemoteRequestID), 400, "remote_block_ids")
	f("/kv_transfer/read", fmt.Sprintf(`{"remote_engine_id":%q,"remote_request_id":%q,"remote_block_ids":%s}`,
		engine, params.RemoteRequestID, jsonOf(params.RemoteBlockIDs)), 200, `"blocks":2`)
	f("/kv_transfer/release", fmt.Sprintf(`{"remote_engine_id":%q,"remote_request_id":%q}`, engine, params.RemoteRequestID), 200, "{}")
	waitUntil(t, "the blocks released", func() bool { return m.Stats().Held == 0 })
}

// TestTransferBlockSizeMismatch: blocks of another size cannot be read into ours (NixlConnector
// refuses such a peer at its handshake); the decode worker computes the prompt instead.
func TestTransferBlockSizeMismatch(t *testing.T) {
	p := start(t, func(c *Config) { c.BlockSize = 32 })
	d := start(t, func(c *Config) { c.WorkerID = 2 })
	prompt := promptOf(4000, 16) // one block on either side
	decode(t, d, prompt, 2, prefill(t, p, prompt))
	if st := d.Stats(); st.Failed != 1 || st.Received != 0 || st.ComputedTokens != 16 {
		t.Errorf("decode worker %+v", st)
	}
	// Not read, not released: the prefill worker keeps them until they expire.
	if st := p.Stats(); st.Sent != 0 {
		t.Errorf("prefill worker %+v", st)
	}
}

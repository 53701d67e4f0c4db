package mocker

import "testing"

// TestEventStreamAllocs: once a few streams have been written, a stream's body allocates
// nothing for its events: its buffers and ticker are kept for the next (api.streams).
func TestEventStreamAllocs(t *testing.T) {
	m := start(t, nil)
	for _, chat := range []bool{false, true} {
		g := &generation{chat: chat, id: "cmpl-1", model: "kvr-mock", prompt: []uint32{1, 2, 3}, output: 4, limit: 4,
			stream: true, usage: true}
		r := &request{wake: make(chan struct{}, 1)}
		p := make([]byte, 4096)
		var sent int
		write := func() {
			r.update(func(r *request) { r.n, r.end = g.output, endFinished })
			s := m.api.newEventStream(g, r, nil)
			sent = 0
			for {
				n, err := s.Read(p)
				sent += n
				if err != nil {
					break
				}
			}
			s.Close()
		}
		write()
		if sent == 0 {
			t.Fatalf("chat %v: nothing written", chat)
		}
		if raceEnabled {
			continue
		}
		if n := testing.AllocsPerRun(100, write); n != 0 {
			t.Errorf("chat %v: %v allocations per stream", chat, n)
		}
	}
}

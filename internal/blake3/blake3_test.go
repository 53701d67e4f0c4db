package blake3

import (
	"encoding/hex"
	"testing"
)

// TestKeyedVectors checks the keyed hash against BLAKE3's own (b3sum --keyed 1.2.0) over the
// input pattern of BLAKE3's test vectors (byte i is i mod 251), at every size where the tree
// changes shape: within a block, a chunk, across chunks and their merges. Written whole and
// byte by byte.
func TestKeyedVectors(t *testing.T) {
	var key [32]byte
	copy(key[:], "whats the Elvish word for friend")
	f := func(n int, want string) {
		t.Helper()
		in := make([]byte, n)
		for i := range in {
			in[i] = byte(i % 251)
		}
		h := New(&key)
		h.Write(in)
		if got := h.Sum(); hex.EncodeToString(got[:]) != want {
			t.Errorf("%d bytes: %x, want %s", n, got, want)
		}
		h = New(&key)
		for i := range in {
			h.Write(in[i : i+1])
		}
		if got := h.Sum(); hex.EncodeToString(got[:]) != want {
			t.Errorf("%d bytes one at a time: %x, want %s", n, got, want)
		}
	}
	f(0, "92b2b75604ed3c761f9d6f62392c8a9227ad0ea3f09573e783f1498a4ed60d26")
	f(1, "6d7878dfff2f485635d39013278ae14f1454b8c0a3a2d34bc1ab38228a80c95b")
	f(63, "bb1eb5d4afa793c1ebdd9fb08def6c36d10096986ae0cfe148cd101170ce37ae")
	f(64, "ba8ced36f327700d213f120b1a207a3b8c04330528586f414d09f2f7d9ccb7e6")
	f(65, "c0a4edefa2d2accb9277c371ac12fcdbb52988a86edc54f0716e1591b4326e72")
	f(1023, "c951ecdf03288d0fcc96ee3413563d8a6d3589547f2c2fb36d9786470f1b9d6e")
	f(1024, "75c46f6f3d9eb4f55ecaaee480db732e6c2105546f1e675003687c31719c7ba4")
	f(1025, "357dc55de0c7e382c900fd6e320acc04146be01db6a8ce7210b7189bd664ea69")
	f(2048, "879cf1fa2ea0e79126cb1063617a05b6ad9d0b696d0d757cf053439f60a99dd1")
	f(2049, "9f29700902f7c86e514ddc4df1e3049f258b2472b6dd5267f61bf13983b78dd5")
	f(3072, "044a0e7b172a312dc02a4c9a818c036ffa2776368d7f528268d2e6b5df191770")
	f(3073, "68dede9bef00ba89e43f31a6825f4cf433389fedae75c04ee9f0cf16a427c95a")
	f(4096, "befc660aea2f1718884cd8deb9902811d332f4fc4a38cf7c7300d597a081bfc0")
	f(4097, "00df940cd36bb9fa7cbbc3556744e0dbc8191401afe70520ba292ee3ca80abbc")
	f(5121, "6ccf1c34753e7a044db80798ecd0782a8f76f33563accaddbfbb2e0ea4b2d024")
	f(8193, "954a2a75420c8d6547e3ba5b98d963e6fa6491addc8c023189cc519821b4a1f5")
	f(31745, "9e64663e9f30783d76a46b3ca41daebce74232dd2dd79253570758670ae3c94b")
}

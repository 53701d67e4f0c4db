package shard_test

import (
	"fmt"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
)

// A worker reports a cached prompt; a request sharing part of it asks who has how much.
func Example() {
	ix, _ := radix.New(radix.Config{BlockSize: 4}) // one index per model
	set := shard.New(shard.Config{Shards: 2})
	defer set.Close()

	// Worker 7 stored a 3-block prompt; its engine named the blocks 11, 12 and 13.
	b := set.NewBatch(ix, 7)
	b.Add(&shard.Event{Kind: shard.Stored, ID: 1, Hashes: []uint64{11, 12, 13},
		Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}})
	set.Enqueue(b)
	set.Barrier() // wait until applied (tests and snapshots; serving does not need to)

	var m radix.Match // reuse per goroutine: matching then allocates nothing
	ix.MatchTokens([]uint32{1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0}, radix.BaseSeed, &m)
	for i, s := range m.Slots {
		w, _ := ix.Worker(s)
		fmt.Printf("worker %d rank %d: %d leading blocks cached, %d blocks in all\n", w.ID, w.Rank, m.Depth[i], ix.Blocks(s))
	}
	// Output: worker 7 rank 0: 2 leading blocks cached, 3 blocks in all
}

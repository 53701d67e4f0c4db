package shard_test

import (
	"fmt"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
)

// A worker reports a cached prompt; a request sharing part of it asks who has how much.
func Example() {
	ix, _ := radix.New(radix.Config{BlockSize: 4}) // one index per model
	set := shard.New(shard.Config{Shards: 2})      // event application, 2 shard goroutines
	defer set.Close()

	// A decoder turns each worker's KV events into shard.Events and enqueues them per worker:
	// here worker 7 stored a 3-block prompt, whose blocks its engine named 11, 12 and 13.
	workerID, engineHashes := uint64(7), []uint64{11, 12, 13}
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	b := set.NewBatch(ix, workerID)
	b.Add(&shard.Event{Kind: shard.Stored, ID: 1, Hashes: engineHashes, Tokens: tokens})
	set.Enqueue(b) // waits if the worker's shard is busy: no unbounded queues
	set.Barrier()  // waits until everything enqueued is applied: a test must, a server need not

	// A request sharing the first two blocks: for every worker holding its first block, the
	// contiguous cached prefix.
	promptTokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0}
	var m radix.Match // one per goroutine; matching then allocates nothing
	// The seed: radix.BaseSeed for the base model, radix.LoRASeed(name) under a LoRA adapter.
	ix.MatchTokens(promptTokens, radix.BaseSeed, &m)
	for i, slot := range m.Slots {
		w, _ := ix.Worker(slot) // worker id and data-parallel rank
		fmt.Printf("worker %d rank %d: %d leading blocks cached, %d blocks in all\n",
			w.ID, w.Rank, m.Depth[i], ix.Blocks(slot))
	}
	// Output: worker 7 rank 0: 2 leading blocks cached, 3 blocks in all
}

package router

import (
	"cmp"
	"encoding/binary"
	"slices"
	"time"
	"unsafe"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/zeebo/xxh3"
)

// Load sharing between replicas.
//
// Replicas behind one event stream hold the same index, but each books only the requests it
// routed. With Config.Share set, a Router tells the others of every booking, prefill-done and
// completion; they apply them with BookRemote, PrefillDoneRemote and CompleteRemote, so that
// a remote request's blocks and prefill tokens count in the cost exactly as a local one's: in
// the same per-worker load, a block shared with any other active request counted once.
// Expiry is not shared: each replica expires its copy itself, after the time the booking
// carries.
//
// Remote requests live in the same Tracker as local ones, under keys no local request can
// have: a local id never starts with a NUL byte (Route refuses such ids, PrefillDone and
// Complete do not find them), and a remote key is a NUL byte, the replica id, then a NUL and
// the request id or, when that would not fit in scoring.MaxRequestID bytes, a 0x01 byte and
// the id's 128-bit XXH3. A replica id holds neither byte, so the keys of distinct replicas'
// requests differ too, and a replica's own ids are stored as they come.

// LoadSharer tells the other router replicas of this one's bookings (see replica.Sharer). The
// Router calls it from many goroutines at once, on the request path, after its own Tracker
// changed: an implementation must be safe for concurrent use, should neither block nor
// allocate, and must not keep the arguments past the call (the strings and slices alias
// request buffers).
type LoadSharer interface {
	// Booked: request id was routed to worker of model, booking seqs (its full blocks'
	// sequence hashes, first block first) and prefill uncached prompt tokens, to be freed
	// after ttl if never completed.
	Booked(model string, worker radix.WorkerKey, id string, seqs []uint64, prefill int64, ttl time.Duration)
	// PrefillDone: request id finished its prefill (it may be called twice for one request).
	PrefillDone(id string)
	// Completed: request id finished; its load is freed.
	Completed(id string)
	// SessionBound: session of model is bound to worker for ttl (session affinity).
	SessionBound(model, session string, worker radix.WorkerKey, ttl time.Duration)
}

// MaxReplicaID is the longest replica id BookRemote and the other Remote methods accept, in
// bytes.
const MaxReplicaID = 64

// remoteMark starts every remote request's Tracker key, and no local request id.
const remoteMark = 0x00

// remoteKeyMax is the longest remote key: the Tracker's limit.
const remoteKeyMax = scoring.MaxRequestID

// isRemoteKey reports whether id is in the remote key space, where no local id may be.
func isRemoteKey(id string) bool { return len(id) > 0 && id[0] == remoteMark }

// appendRemoteKey appends the Tracker key of replica's request id to dst (see the comment at
// the top of this file).
func appendRemoteKey(dst []byte, replica, id string) []byte {
	dst = append(dst, remoteMark)
	dst = append(dst, replica...)
	if 2+len(replica)+len(id) <= remoteKeyMax {
		dst = append(dst, 0x00)
		return append(dst, id...)
	}
	h := xxh3.HashString128(id)
	dst = append(dst, 0x01)
	dst = binary.LittleEndian.AppendUint64(dst, h.Hi)
	return binary.LittleEndian.AppendUint64(dst, h.Lo)
}

// keyString views b as a string without copying: the Tracker copies the ids it keeps, so b
// need only live through the call.
func keyString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func checkRemote(replica, id string) error {
	if len(replica) == 0 || len(replica) > MaxReplicaID {
		return fieldErr(ErrInvalid, "replica", "%d bytes, want 1 to %d", len(replica), MaxReplicaID)
	}
	for i := 0; i < len(replica); i++ {
		if replica[i] <= 0x01 {
			return fieldErr(ErrInvalid, "replica", "byte %d is %#x", i, replica[i])
		}
	}
	if len(id) == 0 || len(id) > scoring.MaxRequestID {
		return fieldErr(ErrInvalid, "request_id", "%d bytes, want 1 to %d", len(id), scoring.MaxRequestID)
	}
	return nil
}

// BookRemote books request id that replica routed to worker of model, exactly as Route books
// a local one: seqs (the request's full blocks' sequence hashes, chained, first block first, as
// the replica's route computed them) count as the worker's active blocks, each once however many
// requests share it, and prefill as its active prefill tokens. Hashes that are not chained
// cannot be told apart; they make the shared counts approximate, within bounds (see
// scoring.Tracker), and leave nothing behind once their requests complete. The booking expires after ttl, or this Router's RequestExpiry if
// shorter. The Router copies what it keeps. Errors: ErrInvalid (replica or request id, ttl,
// prefill tokens, block count), ErrUnknownModel, ErrUnknownWorker (not registered here),
// ErrConflict (replica's request id is booked already).
func (r *Router) BookRemote(replica, model string, worker radix.WorkerKey, id string, seqs []uint64, prefill int64, ttl time.Duration) error {
	if err := checkRemote(replica, id); err != nil {
		return err
	}
	if ttl <= 0 {
		return fieldErr(ErrInvalid, "ttl", "%v is not positive", ttl)
	}
	_, list, i, err := r.bookable(model, worker, seqs, prefill)
	if err != nil {
		return err
	}
	var buf [remoteKeyMax]byte
	key := keyString(appendRemoteKey(buf[:0], replica, id))
	switch err := r.tracker.Book(key, list.loads[i], seqs, prefill, r.cfg.Now()+int64(min(ttl, r.cfg.RequestExpiry))); err {
	case nil:
		return nil
	case scoring.ErrDuplicateRequest:
		return fieldErr(ErrConflict, "request_id", "replica %q's request %q is already active", replica, id)
	default:
		return fieldErr(ErrUnknownWorker, "worker", "%v", err)
	}
}

// PrefillDoneRemote records that replica's request id finished its prefill. ErrUnknownRequest
// if it is not booked here (it was refused, has completed or expired, or was booked before
// this Router started).
func (r *Router) PrefillDoneRemote(replica, id string) error {
	if err := checkRemote(replica, id); err != nil {
		return err
	}
	var buf [remoteKeyMax]byte
	if r.tracker.PrefillDone(keyString(appendRemoteKey(buf[:0], replica, id))) != nil {
		return fieldErr(ErrUnknownRequest, "request_id", "no active request %q of replica %q", id, replica)
	}
	r.drain()
	return nil
}

// CompleteRemote frees replica's request id. ErrUnknownRequest if it is not booked here.
func (r *Router) CompleteRemote(replica, id string) error {
	if err := checkRemote(replica, id); err != nil {
		return err
	}
	var buf [remoteKeyMax]byte
	if r.tracker.Complete(keyString(appendRemoteKey(buf[:0], replica, id))) != nil {
		return fieldErr(ErrUnknownRequest, "request_id", "no active request %q of replica %q", id, replica)
	}
	r.drain()
	return nil
}

// bookable checks a booking of seqs and prefill tokens on worker of model, made elsewhere than
// Route (another replica's, or Book's), and returns the model, its worker list and the worker's
// position in it. Errors: ErrInvalid (prefill tokens, block count), ErrUnknownModel,
// ErrUnknownWorker.
func (r *Router) bookable(model string, worker radix.WorkerKey, seqs []uint64, prefill int64) (*model, *workerList, int, error) {
	if prefill < 0 || prefill > MaxTokens {
		return nil, nil, 0, fieldErr(ErrInvalid, "prefill_tokens", "%d is out of range 0..%d", prefill, MaxTokens)
	}
	m := r.model(model)
	if m == nil {
		return nil, nil, 0, fieldErr(ErrUnknownModel, "model", "no worker is registered for model %q", model)
	}
	if len(seqs) > MaxTokens/m.blockSize {
		return nil, nil, 0, fieldErr(ErrInvalid, "block_hashes", "%d blocks, at most %d", len(seqs), MaxTokens/m.blockSize)
	}
	list := m.list.Load()
	i, ok := slices.BinarySearchFunc(list.keys, worker, func(k, w radix.WorkerKey) int {
		if c := cmp.Compare(k.ID, w.ID); c != 0 {
			return c
		}
		return cmp.Compare(k.Rank, w.Rank)
	})
	if !ok {
		return nil, nil, 0, fieldErr(ErrUnknownWorker, "worker", "worker %d rank %d is not registered for model %q", worker.ID, worker.Rank, model)
	}
	return m, list, i, nil
}

package wire

// The ZMQ frames around engine payloads: the sequence frame of a live message and the replies of
// an engine's replay socket (SPEC.md §10.1).

import (
	"encoding/binary"
	"fmt"
)

// ParseEngineSeq reads the sequence frame of an engine's ZMQ message: a u64, big-endian, in
// exactly 8 bytes. Publishers number their batches from 0 and start again from 0 when they
// restart.
func ParseEngineSeq(frame []byte) (uint64, error) {
	if len(frame) != 8 {
		return 0, &Error{Msg: "engine frames", Field: "seq", Offset: 0, Err: ErrInvalid,
			Detail: fmt.Sprintf("%d bytes, want 8 (big-endian u64)", len(frame))}
	}
	return binary.BigEndian.Uint64(frame), nil
}

// ParseReplayReply reads one message of the replay socket's answer: [seq, payload] (older
// releases), [topic, seq, payload] (newer ones, or a DEALER that keeps the empty delimiter
// frame), or ["", topic, seq, payload]. end reports the marker that closes the answer: seq
// EngineSeqEnd and an empty payload. payload aliases the last frame. Errors are *Error with
// Msg "engine frames" and Offset -1 (a frame index is in Field).
func ParseReplayReply(frames [][]byte) (seq uint64, payload []byte, end bool, err error) {
	bad := func(field string, format string, args ...any) error {
		return &Error{Msg: "engine frames", Field: field, Offset: -1, Err: ErrInvalid, Detail: fmt.Sprintf(format, args...)}
	}
	switch n := len(frames); {
	case n == 2, n == 3:
	case n == 4 && len(frames[0]) == 0:
	default:
		return 0, nil, false, bad("frames", "%d frames, want [seq, payload], [topic, seq, payload] or [\"\", topic, seq, payload]", n)
	}
	n := len(frames)
	sf := frames[n-2]
	if len(sf) != 8 {
		return 0, nil, false, bad(fmt.Sprintf("frames[%d].seq", n-2), "%d bytes, want 8 (big-endian u64)", len(sf))
	}
	seq, payload = binary.BigEndian.Uint64(sf), frames[n-1]
	if seq == EngineSeqEnd {
		if len(payload) != 0 {
			return 0, nil, false, bad(fmt.Sprintf("frames[%d].payload", n-1), "%d bytes after the end marker's seq, want none", len(payload))
		}
		return seq, nil, true, nil
	}
	return seq, payload, false, nil
}

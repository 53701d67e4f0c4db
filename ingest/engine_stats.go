package ingest

// The counters of an engine subscription, per data-parallel rank, and their sums.

import (
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
)

// EngineStats are the counters of a Subscriber or a Bridge; a plain value.
type EngineStats struct {
	Messages        int64 // live messages received, duplicates and malformed ones included
	Batches         int64 // batches handed on (to the sink, or stored by JetStream), replayed ones included
	Events          int64 // events handed to the sink (Subscriber only)
	Replayed        int64 // batches handed on from a replay socket
	DecodeErrors    int64 // messages dropped as malformed: frames, sequence or payload
	Undelivered     int64 // batches the sink refused, or JetStream did not store
	Duplicates      int64 // live messages dropped because their batch was handed on already
	Gaps            int64 // live messages that revealed missed batches
	GapsRecovered   int64 // gaps filled from the replay socket
	GapsUnrecovered int64 // gaps the replay socket could not close (or there was none)
	GapsKept        int64 // ... after which the rank's blocks were kept (EngineConfig.KeepOnGap), not cleared
	Restarts        int64 // engine restarts seen: the sequence went back
	ReplayRequests  int64 // replay requests sent
	Clears          int64 // cleared events handed on: a rank's restarts, unrecovered gaps and lost batches
	Disconnects     int64 // connections lost; each is followed by attempts to connect again
	Oversized       int64 // connections dropped for announcing a message over MaxMessageBytes
	Stalled         int64 // connections dropped for stalling mid-message or mid-handshake
	ProtocolErrors  int64 // connections dropped for breaking ZMTP framing
	Panics          int64 // panics recovered while handling the engine's messages
	UnknownMedium   int64 // events handed to the sink whose medium was unknown, applied as the device tier (Subscriber only)
	Ranks           []RankStats
}

// RankStats describe one data-parallel rank's socket; a plain value.
type RankStats struct {
	Rank      uint32
	Connected bool
	LastSeq   uint64 // sequence of the last batch handed on (0 before the first)
	// State is the rank's state (router.StateConnecting, StateActive or StateStale), and
	// LastBatch the time its last batch was handed on (zero before the first).
	State     router.SourceState
	LastBatch time.Time
	// Counters are the rank's share of EngineStats' counters (its Ranks is nil).
	Counters EngineStats
}

// counter names one of a rank's counters.
type counter uint8

const (
	cMessages counter = iota
	cBatches
	cEvents
	cReplayed
	cDecodeErrors
	cUndelivered
	cDuplicates
	cGaps
	cGapsRecovered
	cGapsUnrecovered
	cGapsKept
	cRestarts
	cReplayRequests
	cClears
	cDisconnects
	cOversized
	cStalled
	cProtocolErrors
	cPanics
	cUnknownMedium
	nCounters
)

// engineCounters are one rank's counters, read by stats while its goroutine writes them.
type engineCounters [nCounters]atomic.Int64

// countValues are counters read at one time, or summed over ranks.
type countValues [nCounters]int64

func (c *engineCounters) load() countValues {
	var v countValues
	for i := range c {
		v[i] = c[i].Load()
	}
	return v
}

func (v *countValues) add(o *countValues) {
	for i := range v {
		v[i] += o[i]
	}
}

func (v *countValues) stats() EngineStats {
	return EngineStats{
		Messages:        v[cMessages],
		Batches:         v[cBatches],
		Events:          v[cEvents],
		Replayed:        v[cReplayed],
		DecodeErrors:    v[cDecodeErrors],
		Undelivered:     v[cUndelivered],
		Duplicates:      v[cDuplicates],
		Gaps:            v[cGaps],
		GapsRecovered:   v[cGapsRecovered],
		GapsUnrecovered: v[cGapsUnrecovered],
		GapsKept:        v[cGapsKept],
		Restarts:        v[cRestarts],
		ReplayRequests:  v[cReplayRequests],
		Clears:          v[cClears],
		Disconnects:     v[cDisconnects],
		Oversized:       v[cOversized],
		Stalled:         v[cStalled],
		ProtocolErrors:  v[cProtocolErrors],
		Panics:          v[cPanics],
		UnknownMedium:   v[cUnknownMedium],
	}
}

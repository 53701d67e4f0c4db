package daemon

import (
	"errors"
	"fmt"
	"os"

	"github.com/kvrouterd/kvrouterd/radix"
)

// The tracking hash (Dynamo's --router-tracking-hash): the identities under which the router
// books a request's active blocks. The messages are Dynamo's (lib/kv-router tracking_hash.rs),
// so that a deployment moved from Dynamo fails the same way; a bad key refuses the start, never
// falls back to public hashes.

const (
	trackingPublic = "public-xxh3-v1" // the public sequence hashes, Dynamo's default
	trackingKeyed  = "keyed-xxh3-v1"  // identities derived from a provider's key
)

// trackingKey returns the key of --router-tracking-key-file under --router-tracking-key-id when
// --router-tracking-hash is keyed-xxh3-v1, nil for public-xxh3-v1. It reads the key file.
func (c *Config) trackingKey() (*radix.TrackingKey, error) {
	switch c.RouterTrackingHash {
	case trackingPublic:
		if c.RouterTrackingKeyFile != "" || c.RouterTrackingKeyID != "" {
			return nil, errors.New("router tracking key options require router_tracking_hash=keyed-xxh3-v1")
		}
		return nil, nil
	case trackingKeyed:
	default:
		return nil, fmt.Errorf("router_tracking_hash must be public-xxh3-v1 or keyed-xxh3-v1, got %q", c.RouterTrackingHash)
	}
	id := c.RouterTrackingKeyID
	if _, err := radix.NewTrackingKey(make([]byte, radix.TrackingKeySize), id); err != nil {
		return nil, errors.New("keyed-xxh3-v1 requires a nonempty router_tracking_key_id")
	}
	if c.RouterTrackingKeyFile == "" {
		return nil, errors.New("keyed-xxh3-v1 requires router_tracking_key_file")
	}
	b, err := os.ReadFile(c.RouterTrackingKeyFile)
	if err != nil {
		return nil, fmt.Errorf("failed to read router tracking key file: %w", err)
	}
	defer clear(b)
	if len(b) != radix.TrackingKeySize {
		return nil, fmt.Errorf("router tracking key file must contain exactly %d raw bytes; found %d", radix.TrackingKeySize, len(b))
	}
	return radix.NewTrackingKey(b, id)
}

package daemon

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvrouterd/kvrouterd/router"
)

// The busy thresholds (router/overload.go) as flags: each is unset unless given, as Dynamo's,
// and an unset one never takes a worker out of routing.

// OptUint is an unsigned integer flag that may be unset; a plain value.
type OptUint struct {
	V  uint64
	On bool
}

type optUintValue struct{ p *OptUint }

func (o optUintValue) String() string {
	if o.p == nil || !o.p.On {
		return ""
	}
	return strconv.FormatUint(o.p.V, 10)
}

// Set takes a count, or Dynamo's None (or nothing) for unset, as OptFloat does.
func (o optUintValue) Set(s string) error {
	if s == "" || strings.EqualFold(s, "none") {
		*o.p = OptUint{}
		return nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("%q: want a whole number of tokens ≥ 0", s)
	}
	*o.p = OptUint{V: v, On: true}
	return nil
}

func (c *Config) busyFlags(fs *flag.FlagSet) {
	fs.Var(&c.ActiveDecodeBlocksThreshold, "active-decode-blocks-threshold",
		"busy threshold: a worker rank is overloaded while its booked or reported active blocks, or its reported used blocks (kv_usage × capacity_blocks), exceed this fraction (0 to 1) of its capacity_blocks; a worker whose every rank is overloaded leaves routing. Unset: off. Per model at run time: POST /busy_threshold")
	fs.Var(optUintValue{&c.ActivePrefillTokensThreshold}, "active-prefill-tokens-threshold",
		"busy threshold: a worker rank is overloaded while its active prefill tokens exceed this many. Unset: off")
	fs.Var(optUintValue{&c.WaitingRequestsThreshold}, "waiting-requests-threshold",
		"busy threshold (kvrouterd's): a worker rank is overloaded while its load reports say more requests than this wait in the engine's own queue. Unset: off")
	fs.Var(&c.ActivePrefillTokensThresholdFrac, "active-prefill-tokens-threshold-frac",
		"busy threshold: a worker rank is overloaded while its active prefill tokens exceed this fraction (≥ 0) of its max_batched_tokens. Unset: off")
	fs.IntVar(&c.OverloadStatus, "overload-status", c.OverloadStatus,
		"HTTP status of a route refused because every eligible worker is overloaded (Dynamo's frontend answers 529; its older releases 503)")
}

// BusyThresholds are the thresholds the flags set, every model's at its creation.
func (c *Config) BusyThresholds() router.Thresholds {
	return router.Thresholds{
		DecodeBlocks: c.ActiveDecodeBlocksThreshold.V, HasDecodeBlocks: c.ActiveDecodeBlocksThreshold.On,
		PrefillTokens: c.ActivePrefillTokensThreshold.V, HasPrefillTokens: c.ActivePrefillTokensThreshold.On,
		PrefillFrac: c.ActivePrefillTokensThresholdFrac.V, HasPrefillFrac: c.ActivePrefillTokensThresholdFrac.On,
		WaitingRequests: c.WaitingRequestsThreshold.V, HasWaitingRequests: c.WaitingRequestsThreshold.On,
	}
}

func (c *Config) checkBusy() error {
	if err := c.BusyThresholds().Check(); err != nil {
		// The router names the threshold as /busy_threshold does: the flag has its name.
		var fe *router.FieldError
		if errors.As(err, &fe) {
			return fmt.Errorf("--%s: %s", strings.ReplaceAll(fe.Field, "_", "-"), fe.Msg)
		}
		return err
	}
	if c.OverloadStatus < 400 || c.OverloadStatus > 599 {
		return fmt.Errorf("--overload-status %d: want an HTTP error status, 400 to 599", c.OverloadStatus)
	}
	return nil
}

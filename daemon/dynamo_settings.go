package daemon

import "log/slog"

// IgnoredSetting is one of Dynamo's router or frontend settings that kvrouterd accepts, so that
// a Dynamo command line starts it, but that changes nothing in kvrouterd.
type IgnoredSetting struct {
	Name   string // Dynamo's flag, --router-snapshot-threshold
	SetBy  string // the flag, or the DYN_ variable, that gave it
	Reason string // why it has no effect
}

// warnIgnored logs one warning line for each setting. l is the log without its rate limit: a
// Dynamo command line may give dozens of these at once, and each must be seen.
func warnIgnored(l *slog.Logger, settings []IgnoredSetting) {
	for _, s := range settings {
		l.Warn(s.Name+": Dynamo's setting is accepted and has no effect in kvrouterd", "set_by", s.SetBy, "reason", s.Reason)
	}
}

package ingest

import (
	"fmt"
	"strconv"
	"strings"
)

// DefaultPrefix is the first token of kvrouterd's subjects.
const DefaultPrefix = "kvr"

// DefaultStream is the name of the JetStream stream of events.
const DefaultStream = "KVR_EVENTS"

// EventSubject is the subject of worker's events.
func EventSubject(prefix, model string, worker uint64) string {
	return prefix + ".events." + ModelToken(model) + "." + strconv.FormatUint(worker, 10)
}

// LoadSubject is the subject of worker's load reports.
func LoadSubject(prefix, model string, worker uint64) string {
	return prefix + ".load." + ModelToken(model) + "." + strconv.FormatUint(worker, 10)
}

// ModelToken escapes a model name into one subject token.
func ModelToken(model string) string {
	var b strings.Builder
	b.Grow(len(model) + 8)
	for i := 0; i < len(model); i++ {
		c := model[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
			continue
		}
		const hex = "0123456789ABCDEF"
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// ParseSubject splits an event or load subject under prefix into its kind ("events" or
// "load"), model and worker.
func ParseSubject(prefix, subject string) (kind, model string, worker uint64, err error) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return "", "", 0, fmt.Errorf("subject %q is not under %q", subject, prefix)
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || parts[0] != "events" && parts[0] != "load" {
		return "", "", 0, fmt.Errorf("subject %q: want %s.events.<model>.<worker> or %s.load.<model>.<worker>", subject, prefix, prefix)
	}
	if model, err = unescape(parts[1]); err != nil || model == "" {
		return "", "", 0, fmt.Errorf("subject %q: bad model token %q", subject, parts[1])
	}
	if worker, err = strconv.ParseUint(parts[2], 10, 64); err != nil {
		return "", "", 0, fmt.Errorf("subject %q: worker %q is not a decimal id", subject, parts[2])
	}
	return parts[0], model, worker, nil
}

func unescape(tok string) (string, error) {
	if !strings.Contains(tok, "%") {
		return tok, nil
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		if tok[i] != '%' {
			b.WriteByte(tok[i])
			continue
		}
		if i+2 >= len(tok) {
			return "", fmt.Errorf("truncated escape")
		}
		v, err := strconv.ParseUint(tok[i+1:i+3], 16, 8)
		if err != nil {
			return "", err
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

package main

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// scrape returns the daemon's /metrics page at addr; "" when it cannot be read.
func scrape(addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// sampleText is the value of the sample name (labels included, as /metrics writes them, in
// alphabetical order) in page.
func sampleText(page, name string) (string, bool) {
	for line := range strings.SplitSeq(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v, true
		}
	}
	return "", false
}

// sample is sampleText as a number; 0 when absent.
func sample(t *testing.T, page, name string) float64 {
	t.Helper()
	v, ok := sampleText(page, name)
	if !ok {
		return 0
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s %s: %v", name, v, err)
	}
	return f
}

// metricValue is sample, failing the test when name is absent.
func metricValue(t *testing.T, page, name string) float64 {
	t.Helper()
	if _, ok := sampleText(page, name); !ok {
		t.Fatalf("no %s in /metrics", name)
	}
	return sample(t, page, name)
}

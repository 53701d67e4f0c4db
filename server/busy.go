package server

import (
	"bytes"
	"encoding/json"
	"errors"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// Dynamo's frontend endpoint for the busy thresholds (its http/service/busy_threshold.rs), in
// its JSON to the field: GET lists every model's, POST reads one model's or, with any threshold
// given, changes those given (router.SetBusyThresholds) and answers the model's after the
// change. Unset thresholds are null. Unknown fields are ignored, as serde does.

// busyThreshold is one model's thresholds as Dynamo's request and answer carry them.
type busyThreshold struct {
	Model         string   `json:"model"`
	DecodeBlocks  *float64 `json:"active_decode_blocks_threshold"`
	PrefillTokens *uint64  `json:"active_prefill_tokens_threshold"`
	PrefillFrac   *float64 `json:"active_prefill_tokens_threshold_frac"`
	// kvrouterd's: the engines' reported waiting requests (Dynamo's clients leave it out).
	WaitingRequests *uint64 `json:"waiting_requests_threshold,omitempty"`
}

func toBusyJSON(model string, t router.Thresholds) busyThreshold {
	b := busyThreshold{Model: model}
	if t.HasDecodeBlocks {
		b.DecodeBlocks = &t.DecodeBlocks
	}
	if t.HasPrefillTokens {
		b.PrefillTokens = &t.PrefillTokens
	}
	if t.HasPrefillFrac {
		b.PrefillFrac = &t.PrefillFrac
	}
	if t.HasWaitingRequests {
		b.WaitingRequests = &t.WaitingRequests
	}
	return b
}

func (b *busyThreshold) thresholds() router.Thresholds {
	var t router.Thresholds
	if b.DecodeBlocks != nil {
		t.DecodeBlocks, t.HasDecodeBlocks = *b.DecodeBlocks, true
	}
	if b.PrefillTokens != nil {
		t.PrefillTokens, t.HasPrefillTokens = *b.PrefillTokens, true
	}
	if b.PrefillFrac != nil {
		t.PrefillFrac, t.HasPrefillFrac = *b.PrefillFrac, true
	}
	if b.WaitingRequests != nil {
		t.WaitingRequests, t.HasWaitingRequests = *b.WaitingRequests, true
	}
	return t
}

// busyThresholds serves GET and POST /busy_threshold.
func (s *Server) busyThresholds(ctx *fasthttp.RequestCtx) {
	switch {
	case bytes.Equal(ctx.Method(), mGet):
		list := s.r.ListBusyThresholds()
		out := struct {
			Thresholds []busyThreshold `json:"thresholds"`
		}{Thresholds: make([]busyThreshold, 0, len(list))}
		for _, m := range list {
			out.Thresholds = append(out.Thresholds, toBusyJSON(m.Model, m.Thresholds))
		}
		s.busyAnswer(ctx, fasthttp.StatusOK, out)
	case bytes.Equal(ctx.Method(), mPost):
		s.setBusyThresholds(ctx)
	default:
		ctx.Response.Header.Set("Allow", "GET, POST")
		s.busyError(ctx, fasthttp.StatusMethodNotAllowed, "method", "use GET or POST")
	}
}

func (s *Server) setBusyThresholds(ctx *fasthttp.RequestCtx) {
	if !bytes.HasPrefix(ctx.Request.Header.ContentType(), []byte("application/json")) {
		s.busyError(ctx, fasthttp.StatusUnsupportedMediaType, "content_type", "Expected request with Content-Type application/json")
		return
	}
	var req busyThreshold
	var model struct {
		Model *string `json:"model"`
	}
	body := ctx.PostBody()
	err := json.Unmarshal(body, &req)
	if err == nil {
		err = json.Unmarshal(body, &model)
		if err == nil && model.Model == nil {
			err = errors.New("missing field `model`")
		}
	}
	if err != nil {
		// Dynamo keeps serde's split: a body that is not JSON is a 400, JSON that does not fit
		// the request (a missing model, a value of the wrong type) a 422; the same text.
		status := fasthttp.StatusUnprocessableEntity
		if se := (*json.SyntaxError)(nil); errors.As(err, &se) {
			status = fasthttp.StatusBadRequest
		}
		_, msg := jsonErrText(err)
		s.busyError(ctx, status, "json", "Failed to parse the request body as JSON: "+msg)
		return
	}
	t := req.thresholds()
	if err := t.Check(); err != nil {
		var fe *router.FieldError
		msg := err.Error()
		if errors.As(err, &fe) {
			msg = fe.Msg
		}
		s.busyError(ctx, fasthttp.StatusBadRequest, "invalid", msg)
		return
	}
	if !t.Configured() {
		cur, _ := s.r.BusyThresholds(req.Model) // an unknown model has none: all null, as Dynamo
		s.busyAnswer(ctx, fasthttp.StatusOK, toBusyJSON(req.Model, cur))
		return
	}
	now, err := s.r.SetBusyThresholds(req.Model, t)
	if err != nil {
		var fe *router.FieldError
		status, msg := fasthttp.StatusBadRequest, err.Error()
		if errors.As(err, &fe) {
			msg = fe.Msg
		}
		if errors.Is(err, router.ErrUnknownModel) {
			status = fasthttp.StatusNotFound
		}
		s.busyError(ctx, status, "invalid", msg)
		return
	}
	s.busyAnswer(ctx, fasthttp.StatusOK, toBusyJSON(req.Model, now))
}

func (s *Server) busyAnswer(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.busyError(ctx, fasthttp.StatusInternalServerError, "internal", err.Error())
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// busyError answers in Dynamo's envelope for this endpoint, {"error": msg}, and counts it.
func (s *Server) busyError(ctx *fasthttp.RequestCtx, status int, reason, msg string) {
	s.m.rejected.WithLabelValues("busy_threshold", reason).Inc()
	s.refusals.Warn("request refused", "endpoint", "busy_threshold", "status", status, "reason", reason, "error", msg)
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// overloadStatus is the status of a route refused with router.ErrOverloaded.
func (c *Config) overloadStatus() int {
	if c.OverloadStatus == 0 {
		return 529
	}
	return c.OverloadStatus
}

// overloadCollector reads the overload filter's state at scrape time.
type overloadCollector struct{ r *router.Router }

var (
	descOverloadRejected = prometheus.NewDesc("kvrouterd_overload_rejections_total",
		"Route requests refused because every eligible worker (or the pinned one) was over its model's busy thresholds.", nil, nil)
	descOverloaded = prometheus.NewDesc("kvrouterd_overloaded_workers",
		"Workers over their model's busy thresholds on every rank, out of routing now, by model (models with thresholds set).", []string{"model"}, nil)
)

func (c overloadCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descOverloadRejected
	ch <- descOverloaded
}

func (c overloadCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descOverloadRejected, prometheus.CounterValue, float64(c.r.OverloadRejected()))
	for model, n := range c.r.OverloadedWorkers() {
		ch <- prometheus.MustNewConstMetric(descOverloaded, prometheus.GaugeValue, float64(n), model)
	}
}

// disaggCollector reads the disaggregated decisions' counts at scrape time.
type disaggCollector struct{ r *router.Router }

var descDisagg = prometheus.NewDesc("kvrouterd_disagg_decisions_total",
	"Route requests that asked for a disaggregated decision, by outcome: disaggregated (a prefill and a decode worker), bypassed (kept whole by the conditional policy), fallback (served whole: no prefill worker), refused (no prefill worker under --enforce-disagg).",
	[]string{"outcome"}, nil)

func (c disaggCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descDisagg }

func (c disaggCollector) Collect(ch chan<- prometheus.Metric) {
	for i, n := range c.r.DisaggDecisions() {
		ch <- prometheus.MustNewConstMetric(descDisagg, prometheus.CounterValue, float64(n), router.DisaggOutcomeNames[i])
	}
}

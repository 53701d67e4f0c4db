package wire

// Override is Dynamo's RouterConfigOverride as its JSON requests carry it (router_config_override
// of a route request, of the front door's nvext, of the selection service's requests). A member
// left out is nil: the router's setting stands. shared_cache_multiplier is accepted; kvrouterd
// has no shared cache. A plain value.
type Override struct {
	OverlapScoreWeight    *float64 `json:"overlap_score_weight"`
	RouterTemperature     *float64 `json:"router_temperature"`
	TrackPrefillTokens    *bool    `json:"track_prefill_tokens"`
	AssumeKVReuse         *bool    `json:"assume_kv_reuse"`
	OverlapScoreCredit    *float64 `json:"overlap_score_credit"`
	PrefillLoadScale      *float64 `json:"prefill_load_scale"`
	SharedCacheMultiplier *float64 `json:"shared_cache_multiplier"`
}

// Apply sets in r every member o gives; a nil o sets nothing.
func (o *Override) Apply(r *RouteRequest) {
	if o == nil {
		return
	}
	if o.OverlapScoreWeight != nil {
		r.HasWeight, r.Weight = true, *o.OverlapScoreWeight
	}
	if o.RouterTemperature != nil {
		r.HasTemperature, r.Temperature = true, *o.RouterTemperature
	}
	if o.TrackPrefillTokens != nil {
		r.TrackPrefill = OptOf(*o.TrackPrefillTokens)
	}
	if o.AssumeKVReuse != nil {
		r.AssumeReuse = OptOf(*o.AssumeKVReuse)
	}
	if o.OverlapScoreCredit != nil {
		r.HasCredit, r.OverlapCredit = true, *o.OverlapScoreCredit
	}
	if o.PrefillLoadScale != nil {
		r.HasLoadScale, r.PrefillLoadScale = true, *o.PrefillLoadScale
	}
}

package agent

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/meridian-quota/meridian/gcra/memstore"
	"github.com/meridian-quota/meridian/internal/regiontest"
)

// current_limit names the limit the rule was configured with, as
// envoyproxy/ratelimit answers it: requests_per_unit per its unit, week,
// month and year included, and 0 per the unit for requests_per_unit: 0
// (upstream's block-all limit). RateLimit-Policy says the same.
//
// Fails on f96aee6: a week, month or year limit was reported as its
// requests per DAY (70/week as 70/DAY, ten times the limit), a longer
// period unscaled per DAY, and the zero limit as 1000000000 per SECOND
// (RateLimit-Policy q=1000000000;w=1): the zero limit has no interval, and
// currentLimit read it as 1 ns.
func TestCurrentLimitNamesTheConfiguredUnit(t *testing.T) {
	const policy = `domain: units
descriptors:
  - key: w
    rate_limit: {unit: week, requests_per_unit: 70}
  - key: mo
    rate_limit: {unit: month, requests_per_unit: 300}
  - key: y
    rate_limit: {unit: year, requests_per_unit: 365}
  - key: p
    rate_limit: {period: 240h, requests_per_unit: 10}
  - key: z
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: s
    rate_limit: {unit: second, requests_per_unit: 0}
`
	ms, err := memstore.New(memstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	node := regiontest.Node(t, policy, ms)
	cfg := DefaultConfig()
	cfg.DrainDelay = 0 // stopped at once
	cfg.Region, cfg.Agent, cfg.Regions = "eu", "eu-1", []string{"eu"}
	cfg.Policy = filepath.Join(t.TempDir(), "policy.yaml")
	cfg.ResponseHeaders = true
	a, err := New(cfg, node, nil)
	if err != nil {
		t.Fatal(err)
	}
	const (
		week  = rlsv3.RateLimitResponse_RateLimit_WEEK
		month = rlsv3.RateLimitResponse_RateLimit_MONTH
		year  = rlsv3.RateLimitResponse_RateLimit_YEAR
		hour  = rlsv3.RateLimitResponse_RateLimit_HOUR
		sec   = rlsv3.RateLimitResponse_RateLimit_SECOND
	)
	tests := []struct {
		key        string
		wantN      uint32
		wantUnit   rlsv3.RateLimitResponse_RateLimit_Unit
		wantPolicy string
	}{
		{"w", 70, week, `"descriptors[0]";q=70;w=604800`},
		{"mo", 300, month, `"descriptors[1]";q=300;w=2592000`},
		{"y", 365, year, `"descriptors[2]";q=365;w=31536000`},
		{"p", 30, month, `"descriptors[3]";q=10;w=864000`}, // 10 per 10 days: 30 per 30-day month
		{"z", 0, hour, `"descriptors[4]";q=0;w=3600`},
		{"s", 0, sec, `"descriptors[5]";q=0;w=1`},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			resp, err := a.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "units",
				Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, tt.key, "a")}})
			if err != nil {
				t.Fatal(err)
			}
			cl := resp.Statuses[0].CurrentLimit
			if cl.GetRequestsPerUnit() != tt.wantN || cl.GetUnit() != tt.wantUnit {
				t.Errorf("current_limit %d per %v, want %d per %v", cl.GetRequestsPerUnit(), cl.GetUnit(), tt.wantN, tt.wantUnit)
			}
			var got string
			for _, h := range resp.ResponseHeadersToAdd {
				if h.Key == "RateLimit-Policy" {
					got = h.Value
				}
			}
			if got != tt.wantPolicy {
				t.Errorf("RateLimit-Policy %q, want %q", got, tt.wantPolicy)
			}
		})
	}
}

// An unlimited descriptor answers OK with limit_remaining 4294967295 and no
// current_limit, as envoyproxy/ratelimit answers it; one that matches no
// limit (the allow-list idiom) answers a bare OK.
//
// Fails on f96aee6: the unlimited descriptor answered a bare OK
// (limit_remaining 0), which a client reading /json or the RLS answer
// takes for a limit with nothing left.
func TestUnlimitedAnswersMaxRemaining(t *testing.T) {
	const policy = `domain: u
descriptors:
  - key: free
    rate_limit: {unlimited: true}
  - key: src
    value: internal
  - key: src
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	ms, err := memstore.New(memstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.DrainDelay = 0 // stopped at once
	cfg.Region, cfg.Agent, cfg.Regions = "eu", "eu-1", []string{"eu"}
	cfg.Policy = filepath.Join(t.TempDir(), "policy.yaml")
	a, err := New(cfg, regiontest.Node(t, policy, ms), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := a.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "u",
		Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "free", "x"), desc(nil, "src", "internal"), desc(nil, "nothing", "x")}})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []uint32{math.MaxUint32, 0, 0} {
		st := resp.Statuses[i]
		if st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil || st.LimitRemaining != want {
			t.Errorf("status %d = %v, want OK, no current_limit, limit_remaining %d", i, st, want)
		}
	}
}

package agent

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/meridian-quota/meridian/region"
)

// postJSON sends body to url's /json with method and the bearer token (if
// any), returning the status and the body.
func postJSON(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url+"/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode < 300 || resp.StatusCode == http.StatusTooManyRequests {
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q, want application/json", ct)
		}
	}
	return resp.StatusCode, string(b)
}

// TestUpstreamJSON: /json answers a RateLimitRequest in protojson as
// envoyproxy/ratelimit does — 200 while OK, 429 when over, with the
// RateLimitResponse the RLS path gives for the same key and state.
func TestUpstreamJSON(t *testing.T) {
	a, cl, url := start(t)
	giveAll(t, a, region.KeyName("users", []region.Entry{{Key: "user", Value: "json"}}),
		region.KeyName("users", []region.Entry{{Key: "user", Value: "grpc"}}))
	// 100/h burst 10: ten back to back, then over for 36 s.
	body := func(user string) string {
		return `{"domain": "users", "descriptors": [{"entries": [{"key": "user", "value": "` + user + `"}]}]}`
	}
	for i := range 11 {
		code, got := postJSON(t, http.MethodPost, url, "", body("json"))
		var resp rlsv3.RateLimitResponse
		if err := protojson.Unmarshal([]byte(got), &resp); err != nil {
			t.Fatalf("request %d: %d %q is no RateLimitResponse: %v", i, code, got, err)
		}
		// The same request on the RLS path, for a key in the same state.
		want, err := cl.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "users", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "user", "grpc")}})
		if err != nil {
			t.Fatal(err)
		}
		wantCode := http.StatusOK
		if i == 10 {
			wantCode = http.StatusTooManyRequests
		}
		if code != wantCode {
			t.Errorf("request %d: status %d, want %d (%s)", i, code, wantCode, got)
		}
		if resp.OverallCode != want.OverallCode || len(resp.Statuses) != 1 ||
			resp.Statuses[0].Code != want.Statuses[0].Code ||
			resp.Statuses[0].LimitRemaining != want.Statuses[0].LimitRemaining ||
			!protoEqualLimit(resp.Statuses[0].CurrentLimit, want.Statuses[0].CurrentLimit) {
			t.Errorf("request %d: /json answered %v, RLS %v", i, &resp, want)
		}
	}
	// Upstream's own example: a domain and descriptor no limit matches is OK.
	if code, got := postJSON(t, http.MethodPost, url, "", `{"domain": "dummy", "descriptors": [{"entries": [{"key": "perday"}]}]}`); code != http.StatusOK || !strings.Contains(got, `"OK"`) {
		t.Errorf("unknown domain: %d %s, want 200 OK", code, got)
	}
	// Any method, as upstream's route has none.
	if code, _ := postJSON(t, http.MethodPut, url, "", body("json-put")); code != http.StatusOK {
		t.Errorf("PUT /json: %d, want 200 as upstream", code)
	}
	for _, tt := range []struct{ name, body string }{
		{"not json", "domain=users"},
		{"empty", ""},
		{"unknown field", `{"domain": "users", "descriptors": [], "tenant": "x"}`},
		{"wrong type", `{"domain": 7}`},
		{"decision refused", `{"domain": "users", "descriptors": [{"entries": [{"key": "user", "value": "x"}], "hits_addend": 99999999999}]}`},
	} {
		if code, got := postJSON(t, http.MethodPost, url, "", tt.body); code != http.StatusBadRequest || strings.TrimSpace(got) != "Bad Request" {
			t.Errorf("%s: %d %q, want 400 Bad Request", tt.name, code, got)
		}
	}
}

func protoEqualLimit(a, b *rlsv3.RateLimitResponse_RateLimit) bool {
	return a.GetRequestsPerUnit() == b.GetRequestsPerUnit() && a.GetUnit() == b.GetUnit()
}

// TestUpstreamJSONAuth: /json takes the bearer token /v1/* does.
func TestUpstreamJSONAuth(t *testing.T) {
	const token = "json-token-0123456789"
	t.Setenv("MERIDIAN_TEST_JSON_TOKENS", token)
	_, _, url := startWith(t, func(c *Config) { c.Auth.TokensEnv = "MERIDIAN_TEST_JSON_TOKENS" })
	body := `{"domain": "users", "descriptors": [{"entries": [{"key": "user", "value": "auth"}]}]}`
	if code, _ := postJSON(t, http.MethodPost, url, "", body); code != http.StatusUnauthorized {
		t.Errorf("without a token: %d, want 401", code)
	}
	if code, _ := postJSON(t, http.MethodPost, url, "wrong-token-0123456789", body); code != http.StatusUnauthorized {
		t.Errorf("with a wrong token: %d, want 401", code)
	}
	if code, got := postJSON(t, http.MethodPost, url, token, body); code != http.StatusOK {
		t.Errorf("with the token: %d %s, want 200", code, got)
	}
}

// TestUpstreamHealthcheck: /healthcheck answers 200 "OK" as upstream's,
// without asking Redis unless told to.
func TestUpstreamHealthcheck(t *testing.T) {
	a, _, _ := start(t)
	h := a.Handler() // served here: SetStoreCheck is called before any request reads it
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthcheck", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(); code != http.StatusOK || body != "OK" {
		t.Errorf("/healthcheck = %d %q, want 200 OK", code, body)
	}
	a.SetStoreCheck(func(context.Context) error { return io.ErrUnexpectedEOF })
	if code, _ := get(); code != http.StatusOK {
		t.Errorf("/healthcheck = %d with the store down by default, want 200 (upstream's default ignores Redis)", code)
	}
	a.SetHealthcheckStore(true)
	if code, _ := get(); code != http.StatusInternalServerError {
		t.Errorf("/healthcheck = %d with the store down and the store check on, want 500", code)
	}
}

package agent

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestHTTPStrictBodies: POST /v1/decide and /v1/reserve take exactly one
// JSON object, sent as application/json, whose strings are UTF-8.
//
// Fails on 4804b9e: any Content-Type (or none) was decoded, trailing data
// after the object was ignored, and invalid UTF-8 — raw bytes or an
// unpaired surrogate escape — became U+FFFD, so "\xff" and "\xfe" (or
// "\ud800" and "\udbff") were one tenant's bucket.
func TestHTTPStrictBodies(t *testing.T) {
	_, _, url := start(t)
	const obj = `{"domain": "users", "descriptors": [{"entries": [{"key": "user", "value": "%s"}]}]%s}`
	body := func(value string) string { return strings.Replace(strings.Replace(obj, "%s", value, 1), "%s", "", 1) }
	tests := []struct {
		name, contentType, body string
		want                    int
		wantMsg                 string
	}{
		{"json", "application/json", body("ann"), 200, ""},
		{"json with charset", "application/json; charset=utf-8", body("ann"), 200, ""},
		{"media type and charset are case-insensitive", "Application/JSON; Charset=UTF-8", body("ann"), 200, ""},
		{"json, trailing white space", "application/json", body("ann") + " \n\t", 200, ""},
		{"no content type", "", body("ann"), 415, "no Content-Type"},
		{"text/plain", "text/plain", body("ann"), 415, `Content-Type "text/plain"`},
		{"form", "application/x-www-form-urlencoded", body("ann"), 415, "send application/json"},
		{"another charset", "application/json; charset=latin1", body("ann"), 415, `charset "latin1"`},
		{"malformed content type", "application/json; charset", body("ann"), 415, "Content-Type"},
		{"a second object", "application/json", body("ann") + ` {}`, 400, "trailing data after the JSON object"},
		{"trailing garbage", "application/json", body("ann") + `x`, 400, "trailing data after the JSON object"},
		{"a second copy", "application/json", body("ann") + body("bob"), 400, "trailing data after the JSON object"},
		{"raw invalid byte", "application/json", body("a\xffb"), 400, "invalid UTF-8 at byte"},
		{"truncated sequence", "application/json", body("caf\xc3"), 400, "invalid UTF-8 at byte"},
		{"lone high surrogate", "application/json", body(`a\ud800b`), 400, `unpaired UTF-16 surrogate \ud800`},
		{"high surrogate at the end", "application/json", body(`a\uDBFF`), 400, `unpaired UTF-16 surrogate \uDBFF`},
		{"two high surrogates", "application/json", body(`\ud83d\ud83d`), 400, "unpaired UTF-16 surrogate"},
		{"lone low surrogate", "application/json", body(`\udc00`), 400, `unpaired UTF-16 surrogate \udc00`},
		{"surrogate pair", "application/json", body(`\ud83d\ude00`), 200, ""},
		{"escaped backslash before u", "application/json", body(`\\ud800`), 200, ""},
		{"UTF-8 text", "application/json", body("café 😀"), 200, ""},
	}
	for _, path := range []string{"/v1/decide", "/v1/reserve"} {
		for _, tt := range tests {
			t.Run(path+"/"+tt.name, func(t *testing.T) {
				b := tt.body
				if path == "/v1/reserve" {
					// The same object with max_wait_ms (before any trailing data).
					b = strings.Replace(b, `]}]}`, `]}], "max_wait_ms": 0}`, 1)
				}
				r, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				if tt.contentType != "" {
					r.Header.Set("Content-Type", tt.contentType)
				}
				resp, err := http.DefaultClient.Do(r)
				if err != nil {
					t.Fatal(err)
				}
				msg, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tt.want || !strings.Contains(string(msg), tt.wantMsg) {
					t.Errorf("%d %q, want %d with %q", resp.StatusCode, msg, tt.want, tt.wantMsg)
				}
			})
		}
	}
}

// TestBearerSchemeCaseInsensitive: the auth scheme is case-insensitive
// (RFC 7235 §2.1), on HTTP and on gRPC metadata alike.
//
// Fails on 4804b9e: only "Bearer " with that case and one space was
// accepted: "bearer <token>" and "BEARER <token>" were refused.
func TestBearerSchemeCaseInsensitive(t *testing.T) {
	const token = "s3cret-token-0123456789"
	t.Setenv("MERIDIAN_TEST_TOKENS", token)
	_, cl, url := startWith(t, func(c *Config) { c.Auth.TokensEnv = "MERIDIAN_TEST_TOKENS" })
	req := &rlsv3.RateLimitRequest{Domain: "users", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "user", "ann")}}
	body := `{"domain": "users", "descriptors": [{"entries": [{"key": "user", "value": "ann"}]}]}`
	tests := []struct {
		header string
		ok     bool
	}{
		{"Bearer " + token, true},
		{"bearer " + token, true},
		{"BEARER " + token, true},
		{"bEaReR " + token, true},
		{"Bearer   " + token, true}, // 1*SP
		{"Bearer " + token + "x", false},
		{"Basic " + token, false},
		{"Bearer" + token, false},
		{"Bearer ", false},
		{token, false},
		{"", false},
	}
	for _, tt := range tests {
		ctx := context.Background()
		if tt.header != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", tt.header)
		}
		_, err := cl.ShouldRateLimit(ctx, req)
		if got := status.Code(err); (got == codes.OK) != tt.ok || (!tt.ok && got != codes.Unauthenticated) {
			t.Errorf("RLS with %q: %v, want ok %v (else Unauthenticated)", tt.header, err, tt.ok)
		}
		r, _ := http.NewRequest(http.MethodPost, url+"/v1/decide", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if tt.header != "" {
			r.Header.Set("Authorization", tt.header)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{true: 200, false: 401}[tt.ok]; resp.StatusCode != want {
			t.Errorf("HTTP with %q: %d, want %d", tt.header, resp.StatusCode, want)
		}
	}
}

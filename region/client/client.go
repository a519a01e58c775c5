package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/meridian-quota/meridian/region/agent/api"
)

// Client calls an agent's HTTP API. Safe for concurrent use.
type Client struct {
	// BaseURL is the agent's HTTP address, e.g. "http://127.0.0.1:8080".
	BaseURL string
	// Token, when set, is sent as "Authorization: Bearer <Token>".
	Token string
	// HTTP is the client used (nil: one with a 100 ms timeout, a decision
	// must not hold a request up).
	HTTP *http.Client
}

var defaultHTTP = &http.Client{Timeout: 100 * time.Millisecond}

// ErrAgent wraps failures to get an answer from the agent: unreachable, or
// a 5xx answer.
var ErrAgent = errors.New("client: agent unavailable")

// RequestError is a 4xx answer: the agent refused the request (malformed
// descriptors, missing credentials). Failing open on it would let a client
// skip the limit at will, so the middleware never does.
type RequestError struct {
	Status  int
	Message string
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("client: agent refused the request: %d %s", e.Status, e.Message)
}

// Decide asks the agent to decide req.
func (c *Client) Decide(ctx context.Context, req *api.DecideRequest) (*api.DecideResponse, error) {
	var out api.DecideResponse
	if err := c.post(ctx, "/v1/decide", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Reserve asks the agent to book the next slot within req.MaxWaitMs.
func (c *Client) Reserve(ctx context.Context, req *api.ReserveRequest) (*api.ReserveResponse, error) {
	var out api.ReserveResponse
	if err := c.post(ctx, "/v1/reserve", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func (c *Client) post(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(c.BaseURL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "application/json")
	if c.Token != "" {
		r.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = defaultHTTP
	}
	resp, err := hc.Do(r)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrAgent, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if resp.StatusCode >= 400 && resp.StatusCode < 500 {
			return &RequestError{Status: resp.StatusCode, Message: strings.TrimSpace(string(msg))}
		}
		return fmt.Errorf("%w: %s: %s", ErrAgent, resp.Status, strings.TrimSpace(string(msg)))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out); err != nil {
		return fmt.Errorf("%w: reply: %w", ErrAgent, err)
	}
	return nil
}

// Options configure the middleware.
type Options struct {
	// Domain is the policy domain the requests are decided in.
	Domain string
	// Describe returns a request's descriptors (e.g. tenant from a header,
	// route from the path). No descriptors: the request is not limited.
	Describe func(*http.Request) []api.DescriptorIn
	// FailOpen lets requests through when the agent cannot answer
	// (unreachable or 5xx); false answers 503. A 4xx from the agent never
	// fails open.
	FailOpen bool
}

// Middleware limits next through the agent.
func Middleware(c *Client, o Options) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			ds := o.Describe(r)
			if len(ds) == 0 {
				next.ServeHTTP(rw, r)
				return
			}
			resp, err := c.Decide(r.Context(), &api.DecideRequest{Domain: o.Domain, Descriptors: ds})
			var re *RequestError
			switch {
			case errors.As(err, &re) && re.Status == http.StatusBadRequest:
				// The descriptors this request produced are malformed (a
				// value too long, say): the request's fault, never a pass.
				problem(rw, http.StatusBadRequest, "Bad Request", "The request cannot be rate limited as sent.", 0)
				return
			case re != nil:
				// Credentials or configuration: the gateway's fault; refuse
				// rather than let traffic through unlimited.
				problem(rw, http.StatusServiceUnavailable, "Rate limiter refused the gateway",
					"The rate limiting service refused this gateway's request; try again later.", 1)
				return
			}
			if err != nil {
				if o.FailOpen {
					next.ServeHTTP(rw, r)
					return
				}
				problem(rw, http.StatusServiceUnavailable, "Rate limiter unavailable",
					"The rate limiting service could not be reached; try again shortly.", 1)
				return
			}
			for k, v := range resp.Headers {
				rw.Header().Set(k, v)
			}
			if resp.Allowed {
				next.ServeHTTP(rw, r)
				return
			}
			retry := retryAfter(resp)
			rw.Header().Set("Retry-After", strconv.FormatInt(retry, 10))
			problem(rw, http.StatusTooManyRequests, "Too Many Requests",
				fmt.Sprintf("Rate limit exceeded; retry in %d s.", retry), retry)
		})
	}
}

// retryAfter is the longest retry-after of the denying descriptors, in
// whole seconds rounded up and at least 1 (RFC 9110 delay-seconds).
func retryAfter(resp *api.DecideResponse) int64 {
	ms := 0.0
	for _, s := range resp.Statuses {
		if s.Code == "OVER_LIMIT" {
			ms = math.Max(ms, s.RetryAfterMs)
		}
	}
	return max(1, int64(math.Ceil(ms/1000)))
}

// problemBody is an RFC 9457 problem detail.
type problemBody struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	RetryAfter int64  `json:"retry_after,omitempty"`
}

func problem(rw http.ResponseWriter, status int, title, detail string, retry int64) {
	rw.Header().Set("Content-Type", "application/problem+json")
	rw.WriteHeader(status)
	_ = json.NewEncoder(rw).Encode(problemBody{Type: "about:blank", Title: title, Status: status, Detail: detail, RetryAfter: retry})
}

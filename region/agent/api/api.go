// Package api holds the JSON types of the agent's HTTP API, shared by the
// agent (region/agent) and its Go client and middleware (region/client),
// which import nothing else of the agent.
package api

// DecideRequest is the body of POST /v1/decide: a domain, its descriptors
// and a cost (hits_addend 0 means 1; a descriptor's own hits_addend
// overrides it, and an explicit 0 peeks) — the same request Envoy sends
// over RLS v3.
type DecideRequest struct {
	Domain      string         `json:"domain"`
	Descriptors []DescriptorIn `json:"descriptors"`
	HitsAddend  uint32         `json:"hits_addend,omitempty"`
}

// DescriptorIn is one descriptor of a request.
type DescriptorIn struct {
	Entries    []EntryIn `json:"entries"`
	HitsAddend *uint64   `json:"hits_addend,omitempty"`
}

// EntryIn is one key/value entry.
type EntryIn struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// DecideResponse is the answer of POST /v1/decide.
type DecideResponse struct {
	Allowed  bool            `json:"allowed"`
	Statuses []DescriptorOut `json:"statuses"`
	// Headers are the response fields a gateway passes to its client:
	// RateLimit-Policy and RateLimit (the agent's pinned draft revision)
	// for the most constraining limit, and Retry-After when denied.
	Headers map[string]string `json:"headers,omitempty"`
}

// DescriptorOut is one descriptor's status, in request order.
type DescriptorOut struct {
	Code string `json:"code"` // OK or OVER_LIMIT
	// Limit is the global limit the key was sold, e.g. "1000/1s burst 200".
	Limit     string `json:"limit,omitempty"`
	Remaining int64  `json:"remaining"`
	// ResetMs is max(TAT − now, 0) when OK, the retry-after when over;
	// RetryAfterMs is set only when over.
	ResetMs      float64 `json:"reset_ms"`
	RetryAfterMs float64 `json:"retry_after_ms,omitempty"`
	Shadow       bool    `json:"shadow,omitempty"`
}

// ReserveRequest is the body of POST /v1/reserve: a decision that books
// the next slot when it is at most MaxWaitMs away, one limit at a time.
type ReserveRequest struct {
	DecideRequest
	MaxWaitMs float64 `json:"max_wait_ms"`
}

// ReserveResponse says whether a slot was booked and how long to wait for
// it; when refused, how long until one could be.
type ReserveResponse struct {
	Booked       bool    `json:"booked"`
	WaitMs       float64 `json:"wait_ms"`
	RetryAfterMs float64 `json:"retry_after_ms,omitempty"`
}

// ErrorResponse is the body of a 503 from POST /v1/decide or /v1/reserve:
// the store failed and a limit's failure_mode is error, so the request was
// not decided and the caller's own failure policy decides (region/client's
// middleware: Options.FailOpen), as Envoy's failure_mode_deny does for
// the RLS call that fails with Unavailable.
type ErrorResponse struct {
	Error string `json:"error"`
}

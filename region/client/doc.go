// Package client is the Go client of a Meridian agent's HTTP API and a
// net/http middleware for gateways and services.
//
// The middleware asks the agent about each request and answers 429 Too
// Many Requests itself when it is over: Retry-After in whole seconds
// rounded up (RFC 9110), the RateLimit-Policy and RateLimit fields the
// agent computed (draft-ietf-httpapi-ratelimit-headers-09, the revision the
// agent pins), and an RFC 9457 application/problem+json body. Allowed
// requests carry the same RateLimit fields. When the agent cannot be
// reached the middleware applies its own failure policy (FailOpen).
//
// It imports only the agent's API types (region/agent/api).
package client

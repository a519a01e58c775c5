// Package loadgen is a closed-loop load generator for rate-limit decisions:
// the measurement helper behind `meridian bench` and the store benchmarks.
//
// # Model
//
// A Target is anything that decides one request for an integer key. Run
// starts Config.Callers goroutines; each loops "pick a key, call
// Target.Decide, record how long it took" until Config.Warmup plus
// Config.Duration have passed, so the offered load is exactly as high as the
// target lets it be (closed loop: a caller never has more than one call
// outstanding). Keys are drawn uniformly from [0, Config.Keys), each caller
// from its own math/rand/v2 PCG source seeded with (Config.Seed, caller
// index), so a seed fixes every caller's key sequence.
//
// A call counts when it starts at or after the end of the warm-up and before
// the end of the run; calls started during the warm-up are discarded.
// Report.Elapsed runs from the end of the warm-up to the end of the last
// counted call, so Report.PerSecond includes the tail of the final calls.
//
// # Latency samples
//
// Each caller records the latency of its counted, successful decisions into
// a slice allocated before the run. All callers together keep at most
// 2,097,152 samples (16 MiB); once a caller's share is full it keeps
// sampling reservoir-style (Vitter's algorithm R, from a source of its own),
// so its kept samples stay a uniform sample of all its calls. P50 and P99
// are nearest-rank percentiles of the merged samples (exact below the cap,
// estimates above it); Max is always exact. Failed calls count in
// Report.Errors but contribute no latency sample.
//
// # Errors
//
// An error from Decide is counted, not fatal. When errors exceed 1 % of all
// counted calls, the Report carries the first error and Run returns it too.
// A context that ends stops the run early; Run then returns the partial
// report with the context's error.
//
// # Targets
//
// MeridianTarget, RedisRateTarget, AutoPipelineTarget and PlainTarget build
// comparable targets on one Redis: the same limit for every key, Keys
// distinct keys each, every target under a key prefix of its own. Their
// Close deletes the target's keys (best effort: the keys also expire on
// their own once rested).
//
// Run and FormatTable are safe for concurrent use; a Target's Decide must be
// safe for concurrent use by Config.Callers goroutines.
package loadgen

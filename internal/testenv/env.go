package testenv

import (
	"os"
	"testing"
)

// Environment variables read by this package.
const (
	// EnvCI is set to "true" by CI; it turns a missing dependency from a
	// skip into a failure.
	EnvCI = "CI"
	// EnvRedisAddr overrides the address of the shared Redis used by [Redis].
	EnvRedisAddr = "MERIDIAN_REDIS_ADDR"
)

// DefaultRedisAddr is where [Redis] looks for the shared Redis when
// MERIDIAN_REDIS_ADDR is unset.
const DefaultRedisAddr = "127.0.0.1:6379"

// InCI reports whether the tests run in CI, that is whether CI is "true".
func InCI() bool { return os.Getenv(EnvCI) == "true" }

// MustOrSkip does nothing when err is nil. Otherwise it ends the test: with
// t.Fatalf when running in CI (see [InCI]), where every dependency is
// required, and with a loud t.Skipf anywhere else. what names the missing
// dependency, e.g. "Redis not reachable at 127.0.0.1:6379".
func MustOrSkip(t testing.TB, err error, what string) {
	t.Helper()
	if err == nil {
		return
	}
	if InCI() {
		t.Fatalf("%s: %v (required when %s=true)", what, err, EnvCI)
		return
	}
	t.Skipf("SKIP: %s: %v; set %s=true to make this a failure", what, err, EnvCI)
}

// SkipShort skips a long test under -short, except in CI (CI=true), where
// a skipped test would be a check that silently did not run: there it
// fails instead.
func SkipShort(t testing.TB, why string) {
	t.Helper()
	if !testing.Short() {
		return
	}
	if InCI() {
		t.Fatalf("-short skips this test (%s), and %s=true requires it to run", why, EnvCI)
		return
	}
	t.Skip(why)
}

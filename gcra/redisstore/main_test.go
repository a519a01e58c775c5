package redisstore

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives its tests: the
// store's lane runners, go-redis pools (closed by testenv's cleanups) and
// the test servers' helpers must all be gone.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

package gossip

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives its tests:
// memberlist's listeners and timers, join loops, NATS connections and the
// embedded servers' helpers must all be gone once their tests clean up.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
